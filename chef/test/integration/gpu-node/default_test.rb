# InSpec checks for role[gpu-node]; needs a GPU instance (kitchen-ec2), not a container.

driver_version = input('nvidia_driver_version', value: '570.172.08')

control 'dlinfra-gpu-node' do
  impact 1.0
  title 'The NVIDIA stack matches the pinned driver and the GPUs work'

  describe command('nvidia-smi --query-gpu=driver_version --format=csv,noheader') do
    its('exit_status') { should eq 0 }
    its('stdout') { should match(/^#{Regexp.escape(driver_version)}$/) }
  end

  describe file('/etc/containerd/config.toml') do
    its('content') { should match(/default_runtime_name = "nvidia"/) }
  end

  describe file('/usr/local/libexec/dlinfra/needs-fabricmanager') do
    it { should be_executable }
  end

  describe service('nvidia-dcgm') do
    it { should be_enabled }
  end

  describe file('/opt/amazon/efa_installed_packages') do
    it { should exist }
  end

  describe service('dlinfra-gpu-check') do
    it { should be_enabled }
  end

  # The watch after the burn-in: the check pulls it in once the node's expectation is written.
  describe service('dlinfra-gpu-watch') do
    it { should be_enabled }
  end

  # The repair: the path unit waits for the request the burn-in agent writes once the cluster approved a repair.
  describe service('dlinfra-gpu-repair.path') do
    it { should be_enabled }
  end

  describe file('/run/dlinfra/gpu-repair') do
    it { should be_directory }
    its('mode') { should cmp '0730' }
  end

  describe command('/opt/dlinfra/gpu-check/bin/python -c "import pynvml, torch; assert torch.cuda.is_available()"') do
    its('exit_status') { should eq 0 }
  end
end
