# amazon-efs-utils at a pinned release, built into a Debian package from its source, skipped when installed.
# The mount helper gives `mount -t efs -o tls,iam,accesspoint=...` (EFS guide, "Mounting with IAM authorization").

efs = node['dlinfra_devbox']['efs_utils']

package efs['build_packages'] do
  not_if { dlinfra_efs_utils_installed?(efs['version']) }
end

git efs['work_dir'] do
  repository efs['repository']
  revision "v#{efs['version']}"
  not_if { dlinfra_efs_utils_installed?(efs['version']) }
end

execute 'build amazon-efs-utils' do
  command ['./build-deb.sh']
  cwd efs['work_dir']
  not_if { dlinfra_efs_utils_installed?(efs['version']) }
end

execute 'install amazon-efs-utils' do
  command "apt-get --yes install #{dlinfra_efs_utils_deb_glob(efs['work_dir'])}"
  not_if { dlinfra_efs_utils_installed?(efs['version']) }
end

directory efs['work_dir'] do
  recursive true
  action :delete
end
