# NVIDIA driver from NVIDIA's CUDA repository, pinned to one exact version.

package dlinfra_kernel_header_packages

apt_repository 'nvidia-cuda' do
  uri dlinfra_cuda_repo_uri
  key "#{dlinfra_cuda_repo_uri}#{node['dlinfra_gpu']['cuda_repo']['key_file']}"
  distribution '/'
  components []
end

# Without the pin apt would take the newest driver of the repository, which Fabric Manager, NSCQ and
# the image's tags would no longer match.
apt_preference 'nvidia-driver' do
  glob dlinfra_driver_pin_glob
  pin "version #{node['dlinfra_gpu']['driver']['version']}-*"
  pin_priority '1001'
end

package dlinfra_driver_packages

# Keeps GPUs initialised between jobs: without it each CUDA process pays driver start-up and DCGM
# sees GPUs come and go.
service 'nvidia-persistenced' do
  action :enable
end

service 'nvidia-persistenced now' do
  service_name 'nvidia-persistenced'
  action :start
  only_if { dlinfra_gpu_present? }
end
