# The per-box setup and the idle stop. Installed on every image; the timer is enabled only by the setup, which runs
# only where the user data wrote a dev box's config.

box = node['dlinfra_devbox']

[::File.dirname(box['idle_script']), ::File.dirname(box['config'])].each do |path|
  directory path do
    mode '0755'
    recursive true
  end
end

cookbook_file box['idle_script'] do
  source 'devbox_idle.py'
  mode '0755'
end

template box['setup_script'] do
  source 'dlinfra-devbox-setup.sh.erb'
  mode '0755'
  variables(config: box['config'], idle_unit: box['idle_unit'], keys_dir: box['authorized_keys_dir'])
end

template "/etc/systemd/system/#{box['idle_unit']}.service" do
  source 'dlinfra-devbox-idle.service.erb'
  mode '0644'
  variables(script: box['idle_script'], config: box['config'], state: box['idle_state'], aws_cli: box['aws_cli'])
  notifies :run, 'execute[devbox daemon-reload]', :immediately
end

template "/etc/systemd/system/#{box['idle_unit']}.timer" do
  source 'dlinfra-devbox-idle.timer.erb'
  mode '0644'
  variables(interval_seconds: box['check_interval_seconds'], config: box['config'])
  notifies :run, 'execute[devbox daemon-reload]', :immediately
end

execute 'devbox daemon-reload' do
  command %w(systemctl daemon-reload)
  action :nothing
end
