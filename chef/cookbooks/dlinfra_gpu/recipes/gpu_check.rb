# The GPU health check, run as the node's burn-in at every boot: the unit writes a report the burn-in agent in the
# cluster reads to let work onto the node (dlinfra/model/gpu_health.py says how the two meet).

check = node['dlinfra_gpu']['gpu_check']

package 'python3-venv'

execute 'gpu check environment' do
  command ['python3', '-m', 'venv', check['venv']]
  creates ::File.join(check['venv'], 'bin', 'python')
end

execute 'gpu check packages' do
  command [::File.join(check['venv'], 'bin', 'pip'), 'install', '--no-cache-dir', *dlinfra_gpu_check_requirements]
  not_if { dlinfra_gpu_check_packages_installed? }
end

directory ::File.dirname(check['script']) do
  recursive true
end

cookbook_file check['script'] do
  source 'gpu_check.py'
  mode '0644'
end

directory check['report_dir'] do
  mode '0755'
  recursive true
end

directory ::File.dirname(check['expectation']) do
  mode '0755'
  recursive true
end

template "/etc/systemd/system/#{check['unit']}" do
  source 'dlinfra-gpu-check.service.erb'
  mode '0644'
  variables(
    python: ::File.join(check['venv'], 'bin', 'python'),
    script: check['script'],
    expectation: check['expectation'],
    report: ::File.join(check['report_dir'], 'report.json'),
    timeout_seconds: check['timeout_seconds']
  )
  notifies :run, 'execute[gpu check daemon-reload]', :immediately
end

execute 'gpu check daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

service check['unit'] do
  action :enable
end
