# Dev box tools. The image carries them on every node, inert: only a box whose user data writes the config runs the
# setup, and only the setup enables the idle timer (docs/dev-boxes.md).

# What the box's user data writes (components/dev_box.py render_user_data): the person, uid, key and home. The idle
# settings are instance tags, read through the instance metadata by the check (dlinfra.model.dev_boxes.IDLE_TAGS).
default['dlinfra_devbox']['config'] = '/etc/dlinfra/devbox.json'
default['dlinfra_devbox']['setup_script'] = '/usr/local/sbin/dlinfra-devbox-setup'
default['dlinfra_devbox']['idle_script'] = '/usr/local/libexec/dlinfra/devbox_idle.py'
default['dlinfra_devbox']['idle_unit'] = 'dlinfra-devbox-idle'
# What a person's session on a box needs beyond the node image: a terminal multiplexer to leave a job running in
# (docs/researchers.md, step 3).
default['dlinfra_devbox']['packages'] = %w(screen tmux)
# The start of idleness is kept on a tmpfs: every boot counts anew.
default['dlinfra_devbox']['idle_state'] = '/run/dlinfra-devbox/idle-since'
# Seconds between idle checks (dlinfra.model.dev_boxes.CHECK_INTERVAL_SECONDS).
default['dlinfra_devbox']['check_interval_seconds'] = 300
# The AWS CLI the idle check publishes its verdict with: the node images' (dlinfra_base::node_join installs the snap,
# node['dlinfra_base']['node_join']['aws_cli']), on both the cpu and gpu images that boxes boot.
default['dlinfra_devbox']['aws_cli'] = '/snap/bin/aws'
# Where sshd looks for a login's keys on a box: root-owned, one file per user, written by the setup from the fleet.
default['dlinfra_devbox']['authorized_keys_dir'] = '/etc/dlinfra/ssh'

# amazon-efs-utils is not packaged for Ubuntu: AWS's guide builds it from source ("Manually installing the Amazon EFS
# client", build-deb.sh). Since 2.0 the build needs Rust and Go for efs-proxy; the package list follows AWS
# ParallelCluster's cookbook for Debian-family hosts (aws-parallelcluster-cookbook, efs partial _debian.rb).
default['dlinfra_devbox']['efs_utils']['repository'] = 'https://github.com/aws/efs-utils.git'
default['dlinfra_devbox']['efs_utils']['version'] = '2.4.1'
default['dlinfra_devbox']['efs_utils']['build_packages'] =
  %w(git binutils dkms pkg-config libssl-dev rustc cargo golang cmake perl)
default['dlinfra_devbox']['efs_utils']['work_dir'] = '/var/cache/dlinfra/efs-utils'
