# Packer and plugin requirements for real builds. Kept out of node.pkr.hcl because Debian's packer
# 1.6.6, which validates node.pkr.hcl offline in tests, predates `required_plugins` and rejects it.
packer {
  required_version = ">= 1.11.0"
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0, < 2.0.0"
    }
  }
}
