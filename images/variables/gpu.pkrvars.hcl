# Layer 2 for the GPU node image; applied after common.pkrvars.hcl.
variant   = "gpu"
chef_role = "gpu-node"

# Must equal chef/nodes/gpu-node.json dlinfra_gpu.driver.version (tests/images checks it).
nvidia_driver_version = "570.172.08"

# Driver, DCGM and the NVIDIA libraries need room; node launch templates grow the volume further.
root_volume_size_gib = 60
