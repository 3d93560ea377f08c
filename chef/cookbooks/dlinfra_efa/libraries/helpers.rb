# Platform logic for dlinfra_efa.
module DlinfraEfa
  module Helpers
    INSTALLED_MARKER = '/opt/amazon/efa_installed_packages'.freeze

    # The installer records its version in the first line of its marker file.
    def dlinfra_efa_installed?(version)
      return false unless ::File.file?(INSTALLED_MARKER)

      ::File.foreach(INSTALLED_MARKER).first.to_s.strip == "# EFA installer version: #{version}"
    end

    def dlinfra_efa_work_dir(version)
      ::File.join(Chef::Config[:file_cache_path], "aws-efa-installer-#{version}")
    end
  end
end

Chef::DSL::Recipe.include(DlinfraEfa::Helpers)
Chef::Resource.include(DlinfraEfa::Helpers)
