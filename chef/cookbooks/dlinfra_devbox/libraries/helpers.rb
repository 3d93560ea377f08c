# Platform logic for dlinfra_devbox: whether the pinned amazon-efs-utils is installed, and where its build lands.
module DlinfraDevbox
  module Helpers
    def dlinfra_efs_utils_installed?(version)
      cmd = shell_out('dpkg-query', '--show', '--showformat=${Version}', 'amazon-efs-utils')
      cmd.exitstatus.zero? && cmd.stdout.strip.start_with?("#{version}-")
    end

    def dlinfra_efs_utils_deb_glob(work_dir)
      ::File.join(work_dir, 'build', 'amazon-efs-utils*.deb')
    end
  end
end

Chef::DSL::Recipe.include(DlinfraDevbox::Helpers)
Chef::Resource.include(DlinfraDevbox::Helpers)
