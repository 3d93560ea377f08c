# NVIDIA Container Toolkit: the runtime containerd hands GPU containers to (see dlinfra_base::containerd).

apt_repository 'nvidia-container-toolkit' do
  uri node['dlinfra_gpu']['container_toolkit']['repo_uri']
  key node['dlinfra_gpu']['container_toolkit']['key_url']
  distribution '/'
  components []
end

# The toolkit's packages move in lockstep; pinning them together avoids a half-upgraded runtime.
apt_preference 'nvidia-container-toolkit' do
  glob 'nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1'
  pin "version #{node['dlinfra_gpu']['container_toolkit']['version']}-*"
  pin_priority '1001'
end

package 'nvidia-container-toolkit'
