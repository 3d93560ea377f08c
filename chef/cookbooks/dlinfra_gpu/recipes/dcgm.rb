# DCGM host engine: health checks and diagnostics on the host; dcgm-exporter (a DaemonSet) reads it.

package node['dlinfra_gpu']['dcgm']['package']

service 'nvidia-dcgm' do
  action :enable
end

service 'nvidia-dcgm now' do
  service_name 'nvidia-dcgm'
  action :start
  only_if { dlinfra_gpu_present? }
end
