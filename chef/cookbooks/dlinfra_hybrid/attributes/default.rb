# EKS Hybrid Nodes: nodeadm installs kubelet and friends, then joins with the NodeConfig that
# `dlinfra site render` produced (it carries the SSM activation, so it never lives in attributes).

default['dlinfra_hybrid']['kubernetes_version'] = '1.33'
# ssm (SSM hybrid activations) or iam-ra (IAM Roles Anywhere); must match the rendered NodeConfig.
default['dlinfra_hybrid']['credential_provider'] = 'ssm'
# Hybrid-nodes nodeadm (not the EC2 one). "latest" follows AWS's channel; set a release and checksum
# to pin it.
default['dlinfra_hybrid']['nodeadm']['release'] = 'latest'
default['dlinfra_hybrid']['nodeadm']['base_url'] = 'https://hybrid-assets.eks.amazonaws.com/releases'
default['dlinfra_hybrid']['nodeadm']['checksum'] = nil

default['dlinfra_hybrid']['node_config_source'] = '/etc/dlinfra/site/nodeadm.yaml'
default['dlinfra_hybrid']['node_config_path'] = '/etc/dlinfra/nodeadm/node-config.yaml'

# Site NFS exports, as in fleet.yaml's sites.<site>.nfs: [{server, export, mount_point[, options]}].
default['dlinfra_hybrid']['nfs_mounts'] = []
# hard: a job blocks on a server restart instead of reading zeros; large rsize/wsize for datasets.
default['dlinfra_hybrid']['nfs_options'] = %w(
  nfsvers=4.1 hard noatime rsize=1048576 wsize=1048576 timeo=600 retrans=2 _netdev
)

# nodeadm writes containerd's configuration on hybrid nodes (including the NVIDIA runtime given in the
# NodeConfig's containerd.config); Chef managing it too would fight nodeadm on every run.
default['dlinfra_base']['containerd']['manage_config'] = false

# The GPU burn-in's expectation that `dlinfra site render` wrote (gpu-expect.json); nil on machines without GPUs.
default['dlinfra_hybrid']['gpu_expectation_source'] = nil
