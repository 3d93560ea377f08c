# A site's IPsec gateway. The tunnel and BGP configuration come from `dlinfra site render` (which knows
# the VPN connections Pulumi created); this cookbook installs the daemons and puts those files in place.

default['dlinfra_gateway']['swanctl_source'] = '/etc/dlinfra/site/swanctl.conf'
default['dlinfra_gateway']['frr_source'] = '/etc/dlinfra/site/frr.conf'
# true: run FRR (BGP with AWS or with the hybrid nodes); nil: only for routing 'bgp'.
default['dlinfra_gateway']['frr'] = nil

# bgp or static, as in fleet.yaml's sites.<site>.routing. Static sites need no FRR.
default['dlinfra_gateway']['routing'] = 'bgp'

# charon-systemd: the swanctl/vici daemon; libcharon-extra-plugins for the kernel-libipsec fallback.
default['dlinfra_gateway']['strongswan_packages'] = %w(
  charon-systemd strongswan-swanctl libcharon-extra-plugins libstrongswan-extra-plugins
)

default['dlinfra_gateway']['frr_daemons'] = %w(bgpd bfdd)

# The rendered tunnels are policy-based and FRR installs only the hybrid nodes' pod routes (frr.conf's
# DLINFRA-KERNEL route-map): charon's own routes (table 220) are the only path to AWS's prefixes and to
# the BGP peers' inside addresses, so keep them on.
default['dlinfra_gateway']['charon']['install_routes'] = true

default['dlinfra_gateway']['sysctl'] = {
  'net.ipv4.ip_forward' => 1,
  # Loose reverse-path filtering: traffic from AWS arrives on the tunnel, replies may leave elsewhere.
  'net.ipv4.conf.all.rp_filter' => 2,
  'net.ipv4.conf.default.rp_filter' => 2,
  # A gateway must not redirect LAN hosts around the tunnel.
  'net.ipv4.conf.all.send_redirects' => 0,
  'net.ipv4.conf.all.accept_redirects' => 0
}
