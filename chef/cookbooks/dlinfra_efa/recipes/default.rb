# EFA driver from AWS's installer, checksum-verified, skipped when this version is already installed.

installer = node['dlinfra_efa']['installer']
tarball = "#{dlinfra_efa_work_dir(installer['version'])}.tar.gz"

remote_file tarball do
  source "#{installer['base_url']}/aws-efa-installer-#{installer['version']}.tar.gz"
  checksum installer['sha256']
  not_if { dlinfra_efa_installed?(installer['version']) }
end

archive_file tarball do
  destination dlinfra_efa_work_dir(installer['version'])
  overwrite :auto
  not_if { dlinfra_efa_installed?(installer['version']) }
end

execute 'efa_installer.sh' do
  command ['./efa_installer.sh', *installer['flags']]
  cwd ::File.join(dlinfra_efa_work_dir(installer['version']), 'aws-efa-installer')
  not_if { dlinfra_efa_installed?(installer['version']) }
end

directory '/etc/systemd/system/containerd.service.d' do
  only_if { node['dlinfra_efa']['containerd_memlock_unlimited'] }
end

template '/etc/systemd/system/containerd.service.d/20-dlinfra-efa-memlock.conf' do
  source 'containerd-memlock.conf.erb'
  only_if { node['dlinfra_efa']['containerd_memlock_unlimited'] }
  notifies :run, 'execute[dlinfra_efa daemon-reload]', :immediately
  notifies :restart, 'service[dlinfra_efa containerd]', :delayed
end

execute 'dlinfra_efa daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

service 'dlinfra_efa containerd' do
  service_name 'containerd'
  action :nothing
end
