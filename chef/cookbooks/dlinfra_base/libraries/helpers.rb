# Platform logic for dlinfra_base, kept out of recipes so that they stay declarative.
module DlinfraBase
  module Helpers
    # Where `dlinfra site render` output lives on a site machine.
    SITE_DIR = '/etc/dlinfra/site'.freeze

    CONTAINERD_RUNTIMES = %w(runc nvidia).freeze

    # Ohai's ec2 plugin fills node['ec2'] on EC2 (Nitro is detected through DMI).
    def dlinfra_on_ec2?
      !node['ec2'].nil?
    end

    def dlinfra_ntp_servers
      servers = Array(node['dlinfra_base']['chrony']['servers'])
      return servers unless servers.empty?

      dlinfra_on_ec2? ? [node['dlinfra_base']['chrony']['ec2_server']] : []
    end

    def dlinfra_kubernetes_apt_uri
      version = node['dlinfra_base']['kubernetes']['version'].to_s
      unless version.match?(/\A1\.\d+\z/)
        raise ArgumentError, "node['dlinfra_base']['kubernetes']['version'] must be a minor version " \
                             "like '1.33', got #{version.inspect}"
      end

      "https://pkgs.k8s.io/core:/stable:/v#{version}/deb/"
    end

    def dlinfra_containerd_runtime
      runtime = node['dlinfra_base']['containerd']['default_runtime']
      return runtime if CONTAINERD_RUNTIMES.include?(runtime)

      raise ArgumentError, "node['dlinfra_base']['containerd']['default_runtime'] must be one of " \
                           "#{CONTAINERD_RUNTIMES.join(', ')}, got #{runtime.inspect}"
    end

    def dlinfra_ecr_credential_provider_url
      provider = node['dlinfra_base']['node_join']['ecr_credential_provider']
      "#{provider['base_url']}/#{provider['version']}/linux/#{dlinfra_apt_arch}/" \
        "ecr-credential-provider-linux-#{dlinfra_apt_arch}"
    end

    def dlinfra_apt_arch
      node['kernel']['machine'] == 'aarch64' ? 'arm64' : 'amd64'
    end

    def dlinfra_swap_active?
      ::File.readlines('/proc/swaps').size > 1
    end

    # Contents of a file that `dlinfra site render` produced; fails the run with the fix when absent.
    def dlinfra_site_file(path)
      return ::File.read(path) if ::File.file?(path)

      raise "#{path} is missing: run `python -m dlinfra site render <site>` and copy its output to " \
            "#{SITE_DIR} on this machine before converging"
    end
  end
end

Chef::DSL::Recipe.include(DlinfraBase::Helpers)
Chef::Resource.include(DlinfraBase::Helpers)
