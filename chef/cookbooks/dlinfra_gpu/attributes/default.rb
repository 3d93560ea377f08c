# NVIDIA software for GPU nodes. One image serves every GPU instance type, so nothing here depends on
# the build machine's hardware; what differs per host (Fabric Manager) is decided at boot.

# Branch and exact version: Fabric Manager and NSCQ must match the driver to the last digit.
default['dlinfra_gpu']['driver']['branch'] = '570'
default['dlinfra_gpu']['driver']['version'] = '570.172.08'
# Open kernel modules: NVIDIA's recommended flavour from Turing on (every GPU dlinfra uses: L4, A10G,
# A100, H100, H200) and the only one for Blackwell.
default['dlinfra_gpu']['driver']['open_kernel_modules'] = true

# NVIDIA's CUDA apt repository carries the driver, Fabric Manager, NSCQ and DCGM at matching versions.
default['dlinfra_gpu']['cuda_repo']['base_uri'] = 'https://developer.download.nvidia.com/compute/cuda/repos'
default['dlinfra_gpu']['cuda_repo']['key_file'] = '3bf863cc.pub'

# Instance types whose GPUs sit on an NVSwitch fabric; must equal the nvswitch: true entries of
# dlinfra/data/instance_types.yaml (tests/chef checks this).
default['dlinfra_gpu']['fabricmanager']['instance_types'] = %w(
  p4d.24xlarge p4de.24xlarge p5.48xlarge p5e.48xlarge p5en.48xlarge
)

default['dlinfra_gpu']['container_toolkit']['version'] = '1.17.8'
default['dlinfra_gpu']['container_toolkit']['repo_uri'] = 'https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)'
default['dlinfra_gpu']['container_toolkit']['key_url'] = 'https://nvidia.github.io/libnvidia-container/gpgkey'

# DCGM 4 for CUDA 12 drivers (the 570 branch is CUDA 12.8); the major version is in the package name.
default['dlinfra_gpu']['dcgm']['package'] = 'datacenter-gpu-manager-4-cuda12'

# GPU containers run through the NVIDIA runtime by default, so the device plugin needs no runtimeClass.
default['dlinfra_base']['containerd']['default_runtime'] = 'nvidia'

# The GPU health check (files/gpu_check.py) and its burn-in at every boot (recipe gpu_check). Paths, the unit and the
# time limit must equal dlinfra/model/gpu_health.py's (tests/chef checks it). The check's own Python environment:
# NVML's bindings at the version the repository tests against (requirements.txt), and PyTorch for the throughput
# tests, whose PyPI wheel for this release is built for CUDA 12.8 (Requires-Dist nvidia-cuda-runtime-cu12==12.8.90),
# which the 570 driver branch runs.
default['dlinfra_gpu']['gpu_check']['venv'] = '/opt/dlinfra/gpu-check'
default['dlinfra_gpu']['gpu_check']['packages'] = {
  'nvidia-ml-py' => '13.615.71',
  'torch' => '2.9.1'
}
default['dlinfra_gpu']['gpu_check']['script'] = '/usr/local/libexec/dlinfra/gpu_check.py'
default['dlinfra_gpu']['gpu_check']['expectation'] = '/etc/dlinfra/gpu-expect.json'
default['dlinfra_gpu']['gpu_check']['report_dir'] = '/var/lib/dlinfra/gpu-check'
default['dlinfra_gpu']['gpu_check']['unit'] = 'dlinfra-gpu-check.service'
default['dlinfra_gpu']['gpu_check']['timeout_seconds'] = 600
# The watch after the burn-in (gpu_check.py watch, recipe gpu_check): its unit, and how often it reads the GPUs and
# writes health.json beside the report. Both must equal dlinfra/model/gpu_health.py's WATCH_UNIT and
# WATCH_INTERVAL_SECONDS, by which the burn-in agent tells a watch that stopped (tests/chef checks it).
default['dlinfra_gpu']['gpu_check']['watch_unit'] = 'dlinfra-gpu-watch.service'
default['dlinfra_gpu']['gpu_check']['watch_interval_seconds'] = 60
# The repair of a node the cluster put off work (gpu_check.py repair, recipe gpu_repair): the burn-in agent writes its
# request into repair_dir (a hostPath), where the path unit starts the repair unit on it. The directory and both units
# must equal dlinfra/model/gpu_health.py's REPAIR_DIR, REPAIR_PATH_UNIT and REPAIR_UNIT (tests/chef checks it). The
# agent runs as uid and gid 65534 (components/pod_scripts.py NOBODY; nogroup on Ubuntu): the directory's group, by
# number, as tmpfiles.d(5) takes it.
default['dlinfra_gpu']['gpu_check']['repair_dir'] = '/run/dlinfra/gpu-repair'
default['dlinfra_gpu']['gpu_check']['repair_group'] = '65534'
default['dlinfra_gpu']['gpu_check']['repair_path_unit'] = 'dlinfra-gpu-repair.path'
default['dlinfra_gpu']['gpu_check']['repair_unit'] = 'dlinfra-gpu-repair.service'
# A MIG pool's layout (recipe mig): the file the user data writes and the unit that applies it must equal
# dlinfra/model/gpu_sharing.py's MIG_LAYOUT_PATH and MIG_UNIT; the marker of the one reboot a mode change may take,
# and the file by which the user data takes that reboot over on a first boot, its MIG_REBOOT_MARKER and
# MIG_DEFER_REBOOT (tests/chef checks them).
default['dlinfra_gpu']['mig']['layout'] = '/etc/dlinfra/mig-layout'
default['dlinfra_gpu']['mig']['unit'] = 'dlinfra-mig.service'
default['dlinfra_gpu']['mig']['reboot_marker'] = '/var/lib/dlinfra/mig-reboot'
default['dlinfra_gpu']['mig']['defer_reboot'] = '/run/dlinfra/mig-defer-reboot'
default['dlinfra_gpu']['mig']['script'] = '/usr/local/libexec/dlinfra/mig-layout'
