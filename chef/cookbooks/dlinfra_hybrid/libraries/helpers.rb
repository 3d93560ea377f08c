# Platform logic for dlinfra_hybrid.
module DlinfraHybrid
  module Helpers
    CREDENTIAL_PROVIDERS = %w(ssm iam-ra).freeze
    NFS_KEYS = %w(server export mount_point options).freeze

    def dlinfra_nodeadm_url
      nodeadm = node['dlinfra_hybrid']['nodeadm']
      arch = node['kernel']['machine'] == 'aarch64' ? 'arm64' : 'amd64'
      "#{nodeadm['base_url']}/#{nodeadm['release']}/bin/linux/#{arch}/nodeadm"
    end

    def dlinfra_credential_provider
      provider = node['dlinfra_hybrid']['credential_provider']
      return provider if CREDENTIAL_PROVIDERS.include?(provider)

      raise ArgumentError, "node['dlinfra_hybrid']['credential_provider'] must be one of " \
                           "#{CREDENTIAL_PROVIDERS.join(', ')}, got #{provider.inspect}"
    end

    # True when kubelet of the wanted minor version is on PATH (nodeadm install already ran).
    def dlinfra_kubelet_installed?(minor)
      result = shell_out('kubelet', '--version')
      result.exitstatus.zero? && result.stdout.include?("v#{minor}.")
    rescue Errno::ENOENT
      false
    end

    # Rejects a malformed NFS entry with the key that is wrong, before anything is mounted.
    def dlinfra_nfs_share(share, index)
      where = "node['dlinfra_hybrid']['nfs_mounts'][#{index}]"
      unknown = share.keys - NFS_KEYS
      raise ArgumentError, "#{where}: unknown keys #{unknown.join(', ')}" unless unknown.empty?

      %w(server export mount_point).each do |key|
        raise ArgumentError, "#{where}: #{key} is required" if share[key].to_s.empty?
      end
      %w(export mount_point).each do |key|
        raise ArgumentError, "#{where}: #{key} must be an absolute path" unless share[key].start_with?('/')
      end
      share
    end
  end
end

Chef::DSL::Recipe.include(DlinfraHybrid::Helpers)
Chef::Resource.include(DlinfraHybrid::Helpers)
