# EFA installer: a version with its published SHA-256 (AWS EC2 user guide, "Verify the EFA installer").
default['dlinfra_efa']['installer']['version'] = '1.41.0'
default['dlinfra_efa']['installer']['sha256'] = '3506354cdfbe31ff552fe75f5d0d9bb7efd29cf79bd99457347d29c751c38f9f'
default['dlinfra_efa']['installer']['base_url'] = 'https://efa-installer.amazonaws.com'
# --minimal: kernel module and rdma-core only. libfabric, Open MPI and the NCCL plugin belong in the
# training containers, which must not depend on what the host happens to have.
default['dlinfra_efa']['installer']['flags'] = %w(-y --minimal)

# EFA registers (pins) memory from inside pods; containerd's default memlock limit makes that fail.
default['dlinfra_efa']['containerd_memlock_unlimited'] = true
