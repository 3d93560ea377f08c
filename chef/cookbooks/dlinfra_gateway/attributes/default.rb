# A site's IPsec gateway. The tunnel and BGP configuration come from `dlinfra site render` (which knows
# the VPN connections Pulumi created); this cookbook installs the daemons and puts those files in place.

default['dlinfra_gateway']['swanctl_source'] = '/etc/dlinfra/site/swanctl.conf'
default['dlinfra_gateway']['frr_source'] = '/etc/dlinfra/site/frr.conf'
default['dlinfra_gateway']['charon_source'] = '/etc/dlinfra/site/strongswan-dlinfra.conf'
default['dlinfra_gateway']['sysctl_source'] = '/etc/dlinfra/site/sysctl-dlinfra-gateway.conf'
default['dlinfra_gateway']['nftables_source'] = '/etc/dlinfra/site/dlinfra-mss.nft'
default['dlinfra_gateway']['xfrm_source'] = '/etc/dlinfra/site/dlinfra-xfrm'
# route (XFRM interfaces, the default) or policy, as in fleet.yaml's sites.<site>.tunnel_mode.
default['dlinfra_gateway']['tunnel_mode'] = 'route'
# true: run FRR (routes over the tunnels, BGP with AWS or with the hybrid nodes); nil: route-based or BGP sites.
default['dlinfra_gateway']['frr'] = nil

# bgp or static, as in fleet.yaml's sites.<site>.routing.
default['dlinfra_gateway']['routing'] = 'bgp'

# charon-systemd: the swanctl/vici daemon; libcharon-extra-plugins for the kernel-libipsec fallback.
default['dlinfra_gateway']['strongswan_packages'] = %w(
  charon-systemd strongswan-swanctl libcharon-extra-plugins libstrongswan-extra-plugins
)

default['dlinfra_gateway']['frr_daemons'] = %w(bgpd bfdd)
