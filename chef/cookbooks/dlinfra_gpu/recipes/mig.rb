# A MIG pool's layout, applied by the host at boot (dlinfra.model.gpu_sharing; docs/shared-gpus.md says why the host
# and not NVIDIA's mig-manager): the user data writes the instances to create, then starts the unit, which runs
# before the GPU check, DCGM and the kubelet, and again at every boot (MIG instances do not survive one). Nodes
# whose user data writes no layout skip it (ConditionPathExists). Where the mode needs a GPU reset the machine does
# not offer, it reboots once (the template says how), so it is enabled, as is the kubelet the join configures.

mig = node['dlinfra_gpu']['mig']

directory ::File.dirname(mig['script']) do
  recursive true
end

template mig['script'] do
  source 'mig-layout.sh.erb'
  mode '0755'
  variables(layout: mig['layout'], reboot_marker: mig['reboot_marker'], defer_reboot: mig['defer_reboot'])
end

template "/etc/systemd/system/#{mig['unit']}" do
  source 'dlinfra-mig.service.erb'
  mode '0644'
  variables(script: mig['script'], layout: mig['layout'], check_unit: node['dlinfra_gpu']['gpu_check']['unit'])
  notifies :run, 'execute[mig daemon-reload]', :immediately
end

execute 'mig daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end

service(mig['unit']) { action :enable }
