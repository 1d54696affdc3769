// kstatus-compute reads one Kubernetes object (JSON or YAML) from stdin and prints the verdict
// of sigs.k8s.io/cli-utils' kstatus library (status.Compute): one JSON line with the status
// (Current, InProgress, Failed, ...) and kstatus' message. The tests feed it the
// TaskHandlerBundles the control plane returns, so the health GitOps tools read is computed by
// kstatus itself, never by a re-implementation.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("read stdin: %v", err)
	}
	body, err := yaml.YAMLToJSON(raw)
	if err != nil {
		fail("parse the object: %v", err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(body); err != nil {
		fail("not a Kubernetes object: %v", err)
	}
	result, err := status.Compute(obj)
	if err != nil {
		fail("status.Compute: %v", err)
	}
	out, _ := json.Marshal(map[string]string{
		"status":  result.Status.String(),
		"message": result.Message,
	})
	fmt.Println(string(out))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kstatus-compute: "+format+"\n", args...)
	os.Exit(2)
}
