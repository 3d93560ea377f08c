# The site's GPU burn-in expectation, where the dlinfra_gpu::gpu_check unit reads it at every boot. On the first
# converge the unit has not run this boot (no expectation yet), so it starts now, before the machine joins; later a
# changed expectation takes effect at the next boot or by `dlinfra gpu check` on a drained machine: `start` does
# nothing while this boot's run stands, so a converge never loads GPUs that jobs are using.

check = node['dlinfra_gpu']['gpu_check']

file check['expectation'] do
  content lazy { dlinfra_site_file(node['dlinfra_hybrid']['gpu_expectation_source']) }
  mode '0644'
  notifies :run, 'execute[gpu check now]', :immediately
end

# No wait: the check takes minutes.
execute 'gpu check now' do
  command ['systemctl', 'start', '--no-block', check['unit']]
  action :nothing
end
