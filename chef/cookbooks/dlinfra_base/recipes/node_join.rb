# dlinfra-node-join and what it needs: the AWS CLI (cluster lookup, kubelet tokens) and kubelet's
# ECR credential provider (add-on images such as the VPC CNI live in ECR).

join = node['dlinfra_base']['node_join']

execute 'snap install aws-cli --classic' do
  creates join['aws_cli']
end

directory join['credential_provider_dir'] do
  recursive true
end

remote_file ::File.join(join['credential_provider_dir'], 'ecr-credential-provider') do
  source dlinfra_ecr_credential_provider_url
  checksum join['ecr_credential_provider']['checksum'] if join['ecr_credential_provider']['checksum']
  mode '0755'
end

template '/usr/local/sbin/dlinfra-node-join' do
  source 'dlinfra-node-join.sh.erb'
  mode '0755'
  variables(
    aws_cli: join['aws_cli'],
    credential_provider_dir: join['credential_provider_dir'],
    default_max_pods: join['default_max_pods'],
    kube_reserved_cpu: join['kube_reserved_cpu'],
    kube_reserved_memory: join['kube_reserved_memory']
  )
end
