# Time sync: Kubernetes certificates, IPsec and distributed training all fail on skewed clocks.

package 'chrony'

template '/etc/chrony/chrony.conf' do
  source 'chrony.conf.erb'
  variables(
    servers: dlinfra_ntp_servers,
    pools: node['dlinfra_base']['chrony']['pools']
  )
  notifies :restart, 'service[chrony]', :delayed
end

service 'chrony' do
  action %i(enable start)
end
