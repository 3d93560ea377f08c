# Kernel modules loaded at boot and sysctl settings, both persisted so a reboot keeps them.

template '/etc/modules-load.d/dlinfra.conf' do
  source 'modules-load.conf.erb'
  variables(modules: node['dlinfra_base']['kernel_modules'])
  notifies :restart, 'service[systemd-modules-load]', :immediately
end

# Restarting the unit loads the modules now; the sysctl keys under net.bridge exist only afterwards.
service 'systemd-modules-load' do
  action :nothing
end

node['dlinfra_base']['sysctl'].each do |key, setting|
  sysctl key do
    value setting
  end
end
