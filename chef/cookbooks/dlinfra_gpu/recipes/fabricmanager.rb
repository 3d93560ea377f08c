# Fabric Manager, installed on every GPU image but started only where an NVSwitch fabric exists: on
# p4d/p5 CUDA fails until it runs, on g5/g6 it would fail and stay failed.

package dlinfra_fabricmanager_packages

directory '/usr/local/libexec/dlinfra' do
  recursive true
end

template '/usr/local/libexec/dlinfra/needs-fabricmanager' do
  source 'needs-fabricmanager.sh.erb'
  mode '0755'
  variables(instance_types: node['dlinfra_gpu']['fabricmanager']['instance_types'])
end

directory '/etc/systemd/system/nvidia-fabricmanager.service.d'

# ExecCondition skips the unit (not fails it) when the gate exits 1, so one image serves all types.
template '/etc/systemd/system/nvidia-fabricmanager.service.d/10-dlinfra-nvswitch-only.conf' do
  source 'fabricmanager-nvswitch-only.conf.erb'
  variables(gate: '/usr/local/libexec/dlinfra/needs-fabricmanager')
  notifies :run, 'execute[dlinfra_gpu daemon-reload]', :immediately
end

execute 'dlinfra_gpu daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

service 'nvidia-fabricmanager' do
  action :enable
end

service 'nvidia-fabricmanager now' do
  service_name 'nvidia-fabricmanager'
  action :start
  only_if { dlinfra_needs_fabric_manager? }
end
