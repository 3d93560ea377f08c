# The repair of a node the cluster put off work (dlinfra/model/gpu_health.py, REPAIR_*): the burn-in agent writes the
# approved request into the repair directory, and the path unit starts the repair unit, which runs the health check's
# script (`gpu_check.py repair`): a cloud node marks its instance unhealthy with the AWS CLI, a site machine reboots.

check = node['dlinfra_gpu']['gpu_check']
tmpfiles = '/etc/tmpfiles.d/dlinfra-gpu-repair.conf'

# The directory is in /run, so systemd-tmpfiles makes it at every boot; applied now too, for the image's first boot.
template tmpfiles do
  source 'dlinfra-gpu-repair.conf.erb'
  mode '0644'
  variables(directory: check['repair_dir'], group: check['repair_group'])
  notifies :run, 'execute[gpu repair directory]', :immediately
end

execute 'gpu repair directory' do
  command ['systemd-tmpfiles', '--create', tmpfiles]
  action :nothing
end

template "/etc/systemd/system/#{check['repair_unit']}" do
  source 'dlinfra-gpu-repair.service.erb'
  mode '0644'
  # The AWS CLI where dlinfra_base installs it for the node join (site machines, which only reboot, may lack it).
  variables(python: ::File.join(check['venv'], 'bin', 'python'), script: check['script'],
            request: ::File.join(check['repair_dir'], 'request'),
            aws_cli: node['dlinfra_base']['node_join']['aws_cli'])
  notifies :run, 'execute[gpu repair daemon-reload]', :immediately
end

template "/etc/systemd/system/#{check['repair_path_unit']}" do
  source 'dlinfra-gpu-repair.path.erb'
  mode '0644'
  variables(request: ::File.join(check['repair_dir'], 'request'), repair_unit: check['repair_unit'])
  notifies :run, 'execute[gpu repair daemon-reload]', :immediately
end

execute 'gpu repair daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

# Started as well as enabled: a site machine converges while it runs, and a request may come before its next boot.
service check['repair_path_unit'] do
  action %i(enable start)
end
