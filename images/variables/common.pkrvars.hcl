# Layer 1 of 2, shared by every variant. Layer 2 (cpu.pkrvars.hcl or gpu.pkrvars.hcl) follows it on the
# command line and wins where both set a variable. See images/README.md for the build command.

# First region builds the AMI; the others receive encrypted copies. The reference fleet's regions.
regions = ["us-west-2", "us-east-1", "eu-west-1"]

# Must equal fleet.yaml environments.*.kubernetes.version.
kubernetes_version = "1.33"

# Canonical's release in the AMI name: ubuntu/images/hvm-ssd-gp3/ubuntu-<release>-amd64-server-*.
ubuntu_release = "noble-24.04"

# Cinc Client (community build of Chef Infra Client 18) that runs the cookbooks during the build.
cinc_version = "18.4.12"

build_instance_type    = "c7i.2xlarge"
root_volume_size_gib   = 30
root_volume_iops       = 3000
root_volume_throughput = 250
