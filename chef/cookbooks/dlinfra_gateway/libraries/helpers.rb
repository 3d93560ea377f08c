# Platform logic for dlinfra_gateway.
module DlinfraGateway
  module Helpers
    ROUTING_MODES = %w(bgp static).freeze
    TUNNEL_MODES = %w(route policy).freeze
    XFRM_SCRIPT = '/usr/local/sbin/dlinfra-xfrm'.freeze
    NFTABLES_FILE = '/etc/dlinfra/dlinfra-mss.nft'.freeze
    # Daemons FRR's /etc/frr/daemons knows (zebra and staticd always run).
    FRR_DAEMONS = %w(
      bgpd ospfd ospf6d ripd ripngd isisd pimd pim6d ldpd nhrpd eigrpd babeld sharpd pbrd bfdd fabricd
      vrrpd pathd
    ).freeze

    def dlinfra_routing
      routing = node['dlinfra_gateway']['routing']
      return routing if ROUTING_MODES.include?(routing)

      raise ArgumentError, "node['dlinfra_gateway']['routing'] must be one of #{ROUTING_MODES.join(', ')}, " \
                           "got #{routing.inspect}"
    end

    def dlinfra_bgp?
      dlinfra_routing == 'bgp'
    end

    def dlinfra_route_based?
      mode = node['dlinfra_gateway']['tunnel_mode']
      return mode == 'route' if TUNNEL_MODES.include?(mode)

      raise ArgumentError, "node['dlinfra_gateway']['tunnel_mode'] must be one of #{TUNNEL_MODES.join(', ')}, " \
                           "got #{mode.inspect}"
    end

    # FRR runs where the gateway routes over its tunnel interfaces (route-based sites) or speaks BGP: with AWS
    # (BGP sites) or with its hybrid nodes (any site with hybrid pods). The rendered node JSON says which.
    def dlinfra_frr?
      explicit = node['dlinfra_gateway']['frr']
      explicit.nil? ? (dlinfra_route_based? || dlinfra_bgp?) : explicit == true
    end

    def dlinfra_frr_daemons
      wanted = Array(node['dlinfra_gateway']['frr_daemons'])
      unknown = wanted - FRR_DAEMONS
      return wanted if unknown.empty?

      raise ArgumentError, "node['dlinfra_gateway']['frr_daemons']: unknown daemons #{unknown.join(', ')}; " \
                           "known: #{FRR_DAEMONS.join(', ')}"
    end
  end
end

Chef::DSL::Recipe.include(DlinfraGateway::Helpers)
Chef::Resource.include(DlinfraGateway::Helpers)
