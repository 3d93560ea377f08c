# The NVIDIA stack of a GPU node, in dependency order.

include_recipe 'dlinfra_gpu::driver'
include_recipe 'dlinfra_gpu::fabricmanager'
include_recipe 'dlinfra_gpu::container_toolkit'
include_recipe 'dlinfra_gpu::dcgm'
include_recipe 'dlinfra_gpu::mig'
include_recipe 'dlinfra_gpu::gpu_check'
