# InSpec checks for role[site-gateway] with the kitchen fixtures in place of a real site render.

control 'dlinfra-site-gateway' do
  impact 1.0
  title 'strongSwan and FRR run with the rendered configuration'

  describe file('/etc/swanctl/conf.d/dlinfra.conf') do
    its('mode') { should cmp '0600' }
  end

  describe service('strongswan') do
    it { should be_enabled }
    it { should be_running }
  end

  describe command('swanctl --list-conns') do
    its('stdout') { should match(/aws-tunnel-1/) }
  end

  describe file('/etc/frr/daemons') do
    its('content') { should match(/^bgpd=yes$/) }
    its('content') { should match(/^ospfd=no$/) }
  end

  describe service('frr') do
    it { should be_running }
  end

  describe kernel_parameter('net.ipv4.conf.all.rp_filter') do
    its('value') { should eq 2 }
  end

  describe kernel_parameter('net.ipv4.ip_forward') do
    its('value') { should eq 1 }
  end

  # Route-based: the tunnels' XFRM interfaces, created by the boot unit before strongSwan.
  describe service('dlinfra-gateway-net') do
    it { should be_enabled }
  end

  describe command('ip -d link show dev xfrm1') do
    its('stdout') { should match(/xfrm if_id 0x1/) }
  end

  describe command('ip -br address show dev xfrm2') do
    its('stdout') { should match(%r{169\.254\.10\.6/30}) }
  end

  describe command('nft list table inet dlinfra_mss') do
    its('stdout') { should match(/maxseg size set 1382/) }
  end

  describe file('/etc/strongswan.d/dlinfra.conf') do
    its('content') { should match(/^\s+retransmit_tries = 3$/) }
  end
end
