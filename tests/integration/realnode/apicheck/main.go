// apicheck: what an in-cluster client does, in a static binary for a busybox image. It reads the
// projected service-account token and CA, dials https://10.0.0.1:443 verifying the serving
// certificate against that CA (so the IP SAN must be there), POSTs a SelfSubjectReview and
// prints the user name the apiserver saw. `apicheck get <url>` prints a plain HTTP GET's body
// instead (busybox-static's wget crashes: static glibc cannot load its resolver modules).
// `apicheck serve <addr> <file>` answers 200 while <file> exists, else 503 (a readiness probe).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"

func main() {
	if len(os.Args) == 4 && os.Args[1] == "serve" {
		flag := os.Args[3]
		http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
			if _, err := os.Stat(flag); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		check(http.ListenAndServe(os.Args[2], nil))
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "get" {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(os.Args[2])
		check(err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		check(err)
		fmt.Print(string(raw))
		return
	}
	token, err := os.ReadFile(sa + "token")
	check(err)
	caPEM, err := os.ReadFile(sa + "ca.crt")
	check(err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		check(fmt.Errorf("no certificate in ca.crt"))
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	req, err := http.NewRequest("POST", "https://10.0.0.1:443/apis/authentication.k8s.io/v1/selfsubjectreviews", bytes.NewReader(body))
	check(err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	check(err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	check(err)
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	check(json.Unmarshal(raw, &review))
	fmt.Printf("status=%d user=%s\n", resp.StatusCode, review.Status.UserInfo.Username)
}

func check(err error) {
	if err != nil {
		fmt.Printf("apicheck error: %v\n", err)
		os.Exit(1)
	}
}
