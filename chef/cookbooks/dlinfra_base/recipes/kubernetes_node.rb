# What every Kubernetes node needs before it joins, on EC2 or at a site: no swap and a container runtime.

# kubelet refuses to start while swap is on.
execute 'dlinfra swapoff' do
  command %w(swapoff --all)
  only_if { dlinfra_swap_active? }
end

ruby_block 'dlinfra comment out swap in fstab' do
  block do
    fstab = Chef::Util::FileEdit.new('/etc/fstab')
    fstab.search_file_replace(/^([^#]\S*\s+\S+\s+swap\s.*)$/, '# \1')
    fstab.write_file
  end
  only_if { ::File.readlines('/etc/fstab').any? { |line| line.match?(/^[^#]\S*\s+\S+\s+swap\s/) } }
end

include_recipe 'dlinfra_base::containerd'
