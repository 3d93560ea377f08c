# Platform logic for dlinfra_gpu: package names from the driver branch, and NVSwitch detection.
module DlinfraGpu
  module Helpers
    NVIDIA_PCI_VENDOR = '0x10de'.freeze
    # NVSwitch chips show up as PCI bridges of class 0x0680; GPUs are 0x0300 or 0x0302.
    NVSWITCH_PCI_CLASS = '0x0680'.freeze
    GPU_PCI_CLASSES = %w(0x0300 0x0302).freeze

    def dlinfra_driver_branch
      branch = node['dlinfra_gpu']['driver']['branch'].to_s
      version = node['dlinfra_gpu']['driver']['version'].to_s
      unless version.start_with?("#{branch}.")
        raise ArgumentError, "node['dlinfra_gpu']['driver']['version'] #{version.inspect} is not on branch " \
                             "#{branch.inspect}: set both together"
      end

      branch
    end

    def dlinfra_driver_packages
      flavour = node['dlinfra_gpu']['driver']['open_kernel_modules'] ? '-open' : ''
      ["nvidia-driver-#{dlinfra_driver_branch}#{flavour}"]
    end

    def dlinfra_fabricmanager_packages
      ["nvidia-fabricmanager-#{dlinfra_driver_branch}", "libnvidia-nscq-#{dlinfra_driver_branch}"]
    end

    # apt preference pattern for every package that carries the driver branch in its name.
    def dlinfra_driver_pin_glob
      "/^(lib)?nvidia-.*-#{dlinfra_driver_branch}(-open|-server|-server-open)?$/"
    end

    def dlinfra_cuda_repo_uri
      arch = node['kernel']['machine'] == 'aarch64' ? 'sbsa' : 'x86_64'
      release = node['platform_version'].to_s.delete('.')
      "#{node['dlinfra_gpu']['cuda_repo']['base_uri']}/ubuntu#{release}/#{arch}/"
    end

    # DKMS builds the modules for the running kernel; the meta package keeps headers coming for the next.
    def dlinfra_kernel_header_packages
      release = node['kernel']['release'].to_s
      flavour = release.split('-').last
      ["linux-headers-#{release}", "linux-headers-#{flavour}"]
    end

    def dlinfra_pci_devices(vendor, classes)
      Dir.glob('/sys/bus/pci/devices/*').select do |dev|
        ::File.read(::File.join(dev, 'vendor')).strip == vendor &&
          classes.include?(::File.read(::File.join(dev, 'class')).strip[0, 6])
      rescue Errno::ENOENT
        false
      end
    end

    def dlinfra_gpu_present?
      !dlinfra_pci_devices(NVIDIA_PCI_VENDOR, GPU_PCI_CLASSES).empty?
    end

    # Same decision as the boot-time gate script: an NVSwitch on the PCI bus, or a known NVSwitch type.
    def dlinfra_needs_fabric_manager?
      return true unless dlinfra_pci_devices(NVIDIA_PCI_VENDOR, [NVSWITCH_PCI_CLASS]).empty?

      instance_type = node['ec2'] && node['ec2']['instance_type']
      node['dlinfra_gpu']['fabricmanager']['instance_types'].include?(instance_type)
    end

    # pip requirement specifiers of the GPU check's environment: name==version, sorted.
    def dlinfra_gpu_check_requirements
      node['dlinfra_gpu']['gpu_check']['packages'].sort.map { |name, version| "#{name}==#{version}" }
    end

    # Whether the check's environment holds exactly the pinned versions (pip's own report, so no import runs).
    def dlinfra_gpu_check_packages_installed?
      pip = ::File.join(node['dlinfra_gpu']['gpu_check']['venv'], 'bin', 'pip')
      return false unless ::File.executable?(pip)

      listed = shell_out(pip, 'list', '--format=freeze')
      return false unless listed.exitstatus.zero?

      installed = listed.stdout.lines.map(&:strip)
      dlinfra_gpu_check_requirements.all? { |pin| installed.include?(pin) }
    end
  end
end

Chef::DSL::Recipe.include(DlinfraGpu::Helpers)
Chef::Resource.include(DlinfraGpu::Helpers)
