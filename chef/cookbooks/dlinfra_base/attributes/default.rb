# Baseline for every dlinfra machine: EC2 nodes baked by Packer, site GPU nodes and site gateways.

default['dlinfra_base']['packages'] = %w(ca-certificates curl gnupg jq ethtool pciutils nvme-cli)

# Nodes are immutable (EC2) or converged by Chef (sites): an unattended kernel upgrade would leave
# DKMS-built GPU and EFA modules behind for the next boot, so updates arrive through a new image or run.
default['dlinfra_base']['unattended_upgrades'] = false

# Loaded at boot through /etc/modules-load.d: overlay for containerd's snapshotter, br_netfilter so that
# bridged pod traffic passes through iptables (kube-proxy and network policies rely on it).
default['dlinfra_base']['kernel_modules'] = %w(overlay br_netfilter)

default['dlinfra_base']['sysctl'] = {
  'net.bridge.bridge-nf-call-iptables' => 1,
  'net.bridge.bridge-nf-call-ip6tables' => 1,
  'net.ipv4.ip_forward' => 1,
  # Many pods each watching files (log shippers, dev servers) exhaust the Ubuntu defaults.
  'fs.inotify.max_user_instances' => 8192,
  'fs.inotify.max_user_watches' => 524_288,
  # Data loaders with many worker processes and memory-mapped datasets.
  'vm.max_map_count' => 1_048_576,
  'kernel.pid_max' => 4_194_304
}

# Empty servers: Amazon Time Sync on EC2, else the pools below. Sites should list their own NTP servers.
default['dlinfra_base']['chrony']['servers'] = []
default['dlinfra_base']['chrony']['ec2_server'] = '169.254.169.123'
default['dlinfra_base']['chrony']['pools'] = %w(ntp.ubuntu.com)

default['dlinfra_base']['containerd']['package'] = 'containerd'
# false where another tool owns /etc/containerd/config.toml (nodeadm on hybrid nodes).
default['dlinfra_base']['containerd']['manage_config'] = true
default['dlinfra_base']['containerd']['sandbox_image'] = 'registry.k8s.io/pause:3.10'
# runc, or nvidia on GPU nodes (set by dlinfra_gpu's attributes).
default['dlinfra_base']['containerd']['default_runtime'] = 'runc'
default['dlinfra_base']['containerd']['nvidia_runtime_binary'] = '/usr/bin/nvidia-container-runtime'

# Kubernetes minor version of the EC2 node image; must match the cluster (fleet.yaml kubernetes.version).
default['dlinfra_base']['kubernetes']['version'] = '1.33'
default['dlinfra_base']['kubernetes']['packages'] = %w(kubelet kubectl)

# Joining EC2 nodes to EKS (dlinfra-node-join, run by the node pool's user data).
# The AWS CLI snap is AWS's own build; kubelet's exec credential plugin and describe-cluster use it.
default['dlinfra_base']['node_join']['aws_cli'] = '/snap/bin/aws'
# kubelet's ECR credential provider from cloud-provider-aws; set checksum to pin the download.
default['dlinfra_base']['node_join']['ecr_credential_provider']['version'] = 'v1.33.0'
default['dlinfra_base']['node_join']['ecr_credential_provider']['base_url'] = 'https://artifacts.k8s.io/binaries/cloud-provider-aws'
default['dlinfra_base']['node_join']['ecr_credential_provider']['checksum'] = nil
default['dlinfra_base']['node_join']['credential_provider_dir'] = '/usr/local/lib/dlinfra/credential-providers'
# Used when the pool gives no --max-pods (kubelet's own default).
default['dlinfra_base']['node_join']['default_max_pods'] = 110
# Kept back from pods for kubelet and containerd, so a node under pressure stays manageable.
default['dlinfra_base']['node_join']['kube_reserved_cpu'] = '250m'
default['dlinfra_base']['node_join']['kube_reserved_memory'] = '1Gi'

# Facts about the site that `dlinfra site render` writes into a site machine's node JSON (name, region,
# tunnels, ...): informational, for operators and ohai-style queries; no recipe depends on them.
default['dlinfra']['site'] = {}
