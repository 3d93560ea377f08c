# dlinfra node images: Ubuntu 24.04 from Canonical, provisioned by the same Chef roles as site machines.
# One template, two variants (cpu, gpu) chosen by variable files layered in a fixed order:
#   packer build -var-file=variables/common.pkrvars.hcl -var-file=variables/gpu.pkrvars.hcl \
#                -var git_revision="$(git rev-parse HEAD)" .
# Plugin requirements live in versions.pkr.hcl (see the note there).

variable "variant" {
  type        = string
  description = "Image variant: cpu or gpu. Decides the Chef role and which scripts act."
  validation {
    condition     = contains(["cpu", "gpu"], var.variant)
    error_message = "The variant variable must be cpu or gpu."
  }
}

variable "regions" {
  type        = list(string)
  description = "AWS regions that get the AMI; the first builds it, the rest receive encrypted copies."
  validation {
    condition     = length(var.regions) >= 1
    error_message = "The regions variable must name at least the build region."
  }
}

variable "kubernetes_version" {
  type        = string
  description = "Kubernetes minor version of kubelet in the image, e.g. 1.33; must match the clusters."
  validation {
    # No regex(): Debian's packer 1.6.6 lacks it, and it validates this file in tests.
    condition     = substr(var.kubernetes_version, 0, 2) == "1." && length(split(".", var.kubernetes_version)) == 2
    error_message = "The kubernetes_version variable must be a minor version such as 1.33."
  }
}

variable "nvidia_driver_version" {
  type        = string
  description = "Exact NVIDIA driver version for the gpu variant (e.g. 570.172.08); empty for cpu."
  validation {
    condition     = var.nvidia_driver_version == "" || length(split(".", var.nvidia_driver_version)) == 3
    error_message = "The nvidia_driver_version variable must be empty or a full version such as 570.172.08."
  }
}

variable "chef_role" {
  type        = string
  description = "Chef role the build converges: chef/roles/<role>.json, attributes from chef/nodes/<role>.json."
}

variable "ubuntu_release" {
  type        = string
  description = "Canonical release in the AMI name, codename-version: noble-24.04."
}

variable "cinc_version" {
  type        = string
  description = "Cinc Client version used to run Chef during the build (removed from the image afterwards)."
}

variable "build_instance_type" {
  type        = string
  description = "Instance type of the build machine; GPU drivers build with DKMS and need no GPU."
}

variable "root_volume_size_gib" {
  type        = number
  description = "Root volume (and AMI snapshot) size, GiB."
}

variable "root_volume_iops" {
  type        = number
  description = "gp3 IOPS of the root volume (3000 to 16000)."
}

variable "root_volume_throughput" {
  type        = number
  description = "gp3 throughput of the root volume, MiB/s (125 to 1000)."
}

variable "git_revision" {
  type        = string
  default     = "unknown"
  description = "Commit the image was built from; CI passes $(git rev-parse HEAD)."
}

variable "ami_name_prefix" {
  type        = string
  default     = "dlinfra-node"
  description = "AMI names are <prefix>-<variant>-k8s<version>-<timestamp>."
}

locals {
  timestamp     = formatdate("YYYYMMDD-hhmmss", timestamp())
  ami_name      = "${var.ami_name_prefix}-${var.variant}-k8s${var.kubernetes_version}-${local.timestamp}"
  chef_run_list = "role[${var.chef_role}]"
  chef_dir      = "/tmp/dlinfra-chef"

  # Provenance on the AMI and its snapshots in every region. The amazon builder fills in the
  # {{ .SourceAMI }} template values itself at build time.
  tags = {
    "Name"                          = local.ami_name
    "dlinfra:variant"               = var.variant
    "dlinfra:git-revision"          = var.git_revision
    "dlinfra:kubernetes-version"    = var.kubernetes_version
    "dlinfra:nvidia-driver-version" = var.nvidia_driver_version == "" ? "none" : var.nvidia_driver_version
    "dlinfra:chef-run-list"         = local.chef_run_list
    "dlinfra:cinc-version"          = var.cinc_version
    "dlinfra:source-ami"            = "{{ .SourceAMI }}"
    "dlinfra:source-ami-name"       = "{{ .SourceAMIName }}"
    "dlinfra:built-by"              = "packer"
  }

  # Every script gets the same environment; each decides from DLINFRA_VARIANT whether it acts.
  script_env = [
    "DLINFRA_VARIANT=${var.variant}",
    "KUBERNETES_VERSION=${var.kubernetes_version}",
    "NVIDIA_DRIVER_VERSION=${var.nvidia_driver_version}",
    "CHEF_ROLE=${var.chef_role}",
    "CINC_VERSION=${var.cinc_version}",
    "DLINFRA_CHEF_DIR=${local.chef_dir}",
  ]
  # Variables go through env after sudo: sudo's env_reset would drop them otherwise.
  sudo = "sudo env {{ .Vars }} bash '{{ .Path }}'"
}

source "amazon-ebs" "ubuntu" {
  region          = var.regions[0]
  ami_regions     = slice(var.regions, 1, length(var.regions))
  ami_name        = local.ami_name
  ami_description = "dlinfra ${var.variant} node, Kubernetes ${var.kubernetes_version}, Ubuntu ${var.ubuntu_release}, ${local.chef_run_list}"
  instance_type   = var.build_instance_type

  source_ami_filter {
    filters = {
      name                = "ubuntu/images/hvm-ssd-gp3/ubuntu-${var.ubuntu_release}-amd64-server-*"
      architecture        = "x86_64"
      virtualization-type = "hvm"
      root-device-type    = "ebs"
    }
    owners      = ["099720109477"] # Canonical
    most_recent = true
  }

  ssh_username = "ubuntu"

  # P4d/P5 need ENA; set explicitly so the AMI can never lose it.
  ena_support   = true
  sriov_support = true

  # Encrypted with the account's default EBS key in each region (copies are re-encrypted there).
  encrypt_boot = true
  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gib
    iops                  = var.root_volume_iops
    throughput            = var.root_volume_throughput
    encrypted             = true
    delete_on_termination = true
  }

  tags          = local.tags
  snapshot_tags = local.tags
  run_tags      = merge(local.tags, { "Name" = "packer-build-${local.ami_name}" })

  # BEGIN modern-packer-only: Debian's packer 1.6.6 predates these; tests strip this block before
  # validating with it (images/README.md, "Validating offline").
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  imds_support = "v2.0"
  # END modern-packer-only
}

build {
  name    = "dlinfra-node"
  sources = ["source.amazon-ebs.ubuntu"]

  provisioner "shell" {
    script           = "${path.root}/scripts/00-prepare.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
  }

  # Boot the upgraded kernel, so DKMS builds the GPU and EFA modules for the kernel the image boots.
  provisioner "shell" {
    inline            = ["sudo systemctl reboot"]
    expect_disconnect = true
  }

  provisioner "shell" {
    script           = "${path.root}/scripts/10-install-cinc.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
    pause_before     = "30s"
  }

  provisioner "shell" {
    inline = ["mkdir -p ${local.chef_dir}"]
  }

  # The trailing slash uploads the contents of chef/ (cookbooks, roles, nodes) into chef_dir.
  provisioner "file" {
    source      = "${path.root}/../chef/"
    destination = local.chef_dir
  }

  provisioner "shell" {
    script           = "${path.root}/scripts/20-run-chef.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
  }

  provisioner "shell" {
    script           = "${path.root}/scripts/30-validate-gpu.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
  }

  provisioner "shell" {
    script           = "${path.root}/scripts/80-validate.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
  }

  provisioner "shell" {
    script           = "${path.root}/scripts/90-cleanup.sh"
    environment_vars = local.script_env
    execute_command  = local.sudo
  }

  # One entry per build in manifest.json; dlinfra.model.images.load_manifest keeps the newest per variant.
  post-processor "manifest" {
    output     = "${path.root}/manifest.json"
    strip_path = true
    custom_data = {
      variant               = var.variant
      kubernetes_version    = var.kubernetes_version
      nvidia_driver_version = var.nvidia_driver_version
      chef_run_list         = local.chef_run_list
      git_revision          = var.git_revision
    }
  }
}
