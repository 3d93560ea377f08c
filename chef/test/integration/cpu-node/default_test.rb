# InSpec checks for role[cpu-node]: what the EC2 CPU image must contain before it is published.

control 'dlinfra-cpu-node' do
  impact 1.0
  title 'Kubernetes node prerequisites are in place'

  describe kernel_module('br_netfilter') do
    it { should be_loaded }
  end

  describe kernel_parameter('net.ipv4.ip_forward') do
    its('value') { should eq 1 }
  end

  describe file('/etc/containerd/config.toml') do
    its('content') { should match(/SystemdCgroup = true/) }
  end

  describe service('containerd') do
    it { should be_enabled }
    it { should be_running }
  end

  describe command('kubelet --version') do
    its('stdout') { should match(/v1\.33\./) }
  end

  describe service('kubelet') do
    it { should be_enabled }
  end

  describe package('unattended-upgrades') do
    it { should_not be_installed }
  end
end
