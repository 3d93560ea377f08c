# The site's GPU burn-in expectation, where the dlinfra_gpu::gpu_check unit reads it at every boot; a new or changed
# one starts the check now, before the machine joins (its node registers with the burn-in taint either way).

check = node['dlinfra_gpu']['gpu_check']

file check['expectation'] do
  content lazy { dlinfra_site_file(node['dlinfra_hybrid']['gpu_expectation_source']) }
  mode '0644'
  notifies :run, 'execute[gpu check now]', :immediately
end

# Restart, not start: the unit stays active after this boot's run. No wait: the check takes minutes.
execute 'gpu check now' do
  command ['systemctl', 'restart', '--no-block', check['unit']]
  action :nothing
end
