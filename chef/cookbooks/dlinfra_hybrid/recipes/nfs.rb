# Site NFS exports (datasets, home directories), mounted now and at every boot.

package 'nfs-common'

node['dlinfra_hybrid']['nfs_mounts'].each_with_index do |entry, index|
  share = dlinfra_nfs_share(entry, index)

  directory share['mount_point'] do
    recursive true
  end

  mount share['mount_point'] do
    device "#{share['server']}:#{share['export']}"
    fstype 'nfs'
    options share['options'] || node['dlinfra_hybrid']['nfs_options']
    action %i(mount enable)
  end
end
