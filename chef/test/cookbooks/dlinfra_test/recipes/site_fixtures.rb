# Stand-ins for `dlinfra site render` output, so kitchen suites converge without a real site.
# TEST-NET addresses and a throwaway key only: nothing here may reach a real peer.

directory '/etc/dlinfra/site' do
  mode '0700'
  recursive true
end

%w(
  swanctl.conf frr.conf nodeadm.yaml strongswan-dlinfra.conf sysctl-dlinfra-gateway.conf dlinfra-mss.nft dlinfra-xfrm
).each do |name|
  cookbook_file "/etc/dlinfra/site/#{name}" do
    source "site/#{name}"
    mode '0600'
  end
end
