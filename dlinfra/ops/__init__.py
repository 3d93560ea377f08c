"""Floor 9, operations on what is deployed or about to be: site onboarding and site files, stack outputs, pool
rolls on EC2 Auto Scaling, and the what-happened timeline. The only floor that calls AWS or Kubernetes at run time.

May import the review and checks floors and everything below them.
"""
