# The GPU health check, run as the node's burn-in at every boot: the unit writes a report the burn-in agent in the
# cluster reads to let work onto the node (dlinfra/model/gpu_health.py says how the two meet); then the watch, which
# keeps reading the GPUs for the rest of the boot and writes their health beside the report.

check = node['dlinfra_gpu']['gpu_check']
# What both units run: the check in its environment, against this machine's expectation.
runs = { python: ::File.join(check['venv'], 'bin', 'python'), script: check['script'],
         expectation: check['expectation'] }

package 'python3-venv'

execute 'gpu check environment' do
  command ['python3', '-m', 'venv', check['venv']]
  creates runs[:python]
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

[check['report_dir'], ::File.dirname(check['expectation'])].each do |path|
  directory path do
    mode '0755'
    recursive true
  end
end

template "/etc/systemd/system/#{check['unit']}" do
  source 'dlinfra-gpu-check.service.erb'
  mode '0644'
  variables(**runs, report: ::File.join(check['report_dir'], 'report.json'), timeout_seconds: check['timeout_seconds'])
  notifies :run, 'execute[gpu check daemon-reload]', :immediately
end

# The watch after the burn-in: its ordering and [Install] start it once the check has run (the template says how).
template "/etc/systemd/system/#{check['watch_unit']}" do
  source 'dlinfra-gpu-watch.service.erb'
  mode '0644'
  variables(**runs, check_unit: check['unit'], health: ::File.join(check['report_dir'], 'health.json'),
                    interval_seconds: check['watch_interval_seconds'])
  notifies :run, 'execute[gpu check daemon-reload]', :immediately
end

execute 'gpu check daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

[check['unit'], check['watch_unit']].each { |unit| service(unit) { action :enable } }
include_recipe 'dlinfra_gpu::gpu_repair'
