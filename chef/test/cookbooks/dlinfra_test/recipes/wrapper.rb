# How a lab-specific wrapper cookbook consumes dlinfra: set attributes, then include the recipes.

node.default['dlinfra_base']['chrony']['servers'] = %w(192.0.2.123)
node.default['dlinfra_base']['packages'] = node['dlinfra_base']['packages'] + %w(htop)

include_recipe 'dlinfra_base'
include_recipe 'dlinfra_base::kubernetes_node'
