# Sourced by hack/build-k8s.sh and hack/build-node.sh: build commands of k8s.io/kubernetes at
# $K8S_VERSION (from hack/k8s-env.sh) through a consumer module in the current folder.
#
# Why a consumer module: k8s.io/kubernetes requires its staging modules at v0.0.0 with local
# replaces, which `go install pkg@version` refuses; a consumer module that replaces each staging
# module with its published v0.X.Y release builds fine (see
# shared/reference/k8s-test-control-plane.md).

# k8s_build STAGE MODULE_NAME CMD...: build k8s.io/kubernetes/cmd/<CMD> for each CMD into STAGE,
# with the version stamped as a release build stamps it. Sets K8S_SRC to the module's folder.
k8s_build() {
  local stage=$1 name=$2
  shift 2
  local staging="v0.${K8S_VERSION#1.}" minor mod gomod m c pkg
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  go mod init "example.invalid/$name" >/dev/null 2>&1
  go mod edit -go=1.26
  mod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION")
  gomod=$(printf '%s' "$mod" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  K8S_SRC=$(printf '%s' "$mod" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  for m in $(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print $1}' "$gomod" | sort -u); do
    go mod edit -replace="$m=$m@$staging"
  done
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
  local pkgs=()
  for c in "$@"; do
    go mod edit -tool="k8s.io/kubernetes/cmd/$c"
    pkgs+=("k8s.io/kubernetes/cmd/$c")
  done
  go mod tidy
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  go build -ldflags "$ld" -o "$stage/" "${pkgs[@]}"
}
