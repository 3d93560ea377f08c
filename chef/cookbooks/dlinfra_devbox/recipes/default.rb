# Dev box tools on every node image, inert until a box's user data runs the setup (docs/dev-boxes.md).

package node['dlinfra_devbox']['packages']

include_recipe 'dlinfra_devbox::efs_utils'
include_recipe 'dlinfra_devbox::idle'
