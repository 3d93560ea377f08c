# Baseline of every dlinfra machine: packages, kernel settings and time.

apt_update 'dlinfra' do
  frequency 86_400
  action :periodic
end

package node['dlinfra_base']['packages']

package 'unattended-upgrades' do
  action :remove
  not_if { node['dlinfra_base']['unattended_upgrades'] }
end

include_recipe 'dlinfra_base::kernel'
include_recipe 'dlinfra_base::chrony'
