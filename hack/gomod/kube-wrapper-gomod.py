"""Print a wrapper go.mod that builds k8s.io/kubernetes commands.

k8s.io/kubernetes replaces its staging modules with local directories, which
`go install ...@version` refuses. The wrapper requires k8s.io/kubernetes and
replaces every staging module listed in *its* go.mod with the published
v0.x release, so the list is always generated, never hand-typed.
"""
import re
import sys

gomod_path, kube_version, staging_version = sys.argv[1:4]
text = open(gomod_path).read()
go_line = re.search(r"^go (\S+)", text, re.M).group(1)
staged = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s*=>\s*\./staging/", text, re.M)))
print("module valkey-operator-build/kubernetes\n")
print(f"go {go_line}\n")
print(f"require k8s.io/kubernetes {kube_version}\n")
print("replace (")
for m in staged:
    print(f"\t{m} => {m} {staging_version}")
print(")")
