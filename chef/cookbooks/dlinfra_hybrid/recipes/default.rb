# A site GPU machine: join the region's EKS cluster as a hybrid node and mount the site's NFS exports.

include_recipe 'dlinfra_hybrid::gpu_check' if node['dlinfra_hybrid']['gpu_expectation_source']
include_recipe 'dlinfra_hybrid::nodeadm'
include_recipe 'dlinfra_hybrid::nfs'
