package k8stest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The cache .ci/install-kube fills; the environment variables override it.
const cache = "/var/cache/cdcrelay/kube"

// binary is the path in env, or def; a missing file fails the test, because
// a skipped test would let make test-k8s pass having checked nothing.
func binary(t *testing.T, env, def string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = def
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("%s: %v (run .ci/install-kube, or set %s)", env, err, env)
	}
	return abs
}

// cluster is a running etcd and kube-apiserver, reached with a token in
// system:masters.
type cluster struct {
	url        string
	token      string
	client     *http.Client
	kubeconfig string
	dir        string
}

// freePort asks the kernel for a port that is free now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// certs writes a CA and a serving certificate for 127.0.0.1 signed by it,
// and returns the CA's PEM for the clients.
func certs(t *testing.T, dir string) []byte {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "k8stest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes.default.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "server.crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, "server.key"), "EC PRIVATE KEY", keyDER)
	// Service-account tokens are signed with an RSA key; the same file
	// serves as the verifying key (the server reads the public half).
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// start runs a process with its output in dir/name.log and stops it (TERM,
// then KILL) when the test ends.
func start(t *testing.T, dir, name string, args ...string) (logPath string) {
	t.Helper()
	logPath = filepath.Join(dir, filepath.Base(name)+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = f.Close()
	})
	return logPath
}

// tail is the end of a log, for a failure message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// startCluster starts etcd and kube-apiserver in a temporary folder, waits
// for /readyz and writes a kubeconfig for helm.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	apiserver := binary(t, "KUBE_APISERVER", filepath.Join(cache, "kube-apiserver"))
	etcd := binary(t, "ETCD", filepath.Join(cache, "etcd/usr/bin/etcd"))
	dir := t.TempDir()
	caPEM := certs(t, dir)

	client, peer := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	etcdLog := start(t, dir, etcd, "--name=k8stest", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=k8stest="+peerURL)
	waitFor(t, "etcd", etcdLog, func() bool {
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	token := "k8stest-" + fmt.Sprint(time.Now().UnixNano())
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,k8stest-admin,k8stest-admin,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	// --advertise-address is not 127.0.0.1: with a loopback address the
	// server floods its log about the kubernetes Service's endpoints.
	apiLog := start(t, dir, apiserver,
		"--etcd-servers="+etcdURL,
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--tls-cert-file="+filepath.Join(dir, "server.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "server.key"),
		fmt.Sprintf("--secure-port=%d", port),
		"--bind-address=127.0.0.1", "--advertise-address=10.0.0.1",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		// Privileged containers allowed, as on a real cluster, so that the
		// privileged Pod the test makes is refused by PodSecurity, not by
		// this flag's validation.
		"--allow-privileged=true",
		"--token-auth-file="+tokens)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &cluster{
		url:   fmt.Sprintf("https://127.0.0.1:%d", port),
		token: token, dir: dir,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}},
	}
	waitFor(t, "kube-apiserver", apiLog, func() bool {
		code, _, _ := c.do(http.MethodGet, "/readyz", nil, "")
		return code == http.StatusOK
	})
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: admin
  user: {token: %q}
contexts:
- name: k8stest
  context: {cluster: k8stest, user: admin}
current-context: k8stest
`, c.url, base64.StdEncoding.EncodeToString(caPEM), token)
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor polls ok for up to two minutes (the apiserver's first start on a
// busy two-core machine takes 10-30 s), failing with the log's end.
func waitFor(t *testing.T, what, logPath string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 2 minutes; its log ends:\n%s", what, tail(logPath))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// do sends one request with the token; it returns the status, the body and
// the Warning headers (PodSecurity and deprecation warnings come there).
func (c *cluster) do(method, path string, body []byte, contentType string) (int, []byte, []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Values("Warning")
}

// get decodes a GET's JSON body; any status but 200 fails the test.
func (c *cluster) get(t *testing.T, path string) map[string]any {
	t.Helper()
	code, body, _ := c.do(http.MethodGet, path, nil, "")
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return m
}

// exists says whether GET path finds the object (200) or not (404).
func (c *cluster) exists(t *testing.T, path string) bool {
	t.Helper()
	code, body, _ := c.do(http.MethodGet, path, nil, "")
	switch code {
	case http.StatusOK:
		return true
	case http.StatusNotFound:
		return false
	}
	t.Fatalf("GET %s: %d %s", path, code, body)
	return false
}

// helm runs the helm binary against the cluster with its own config and
// cache folders, so nothing of the user's helm set-up is read or written.
func (c *cluster) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helmCache := os.Getenv("CDCRELAY_HELM_CACHE") // where make -C deploy/helm helm builds it
	if helmCache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no HELM, no CDCRELAY_HELM_CACHE and no user cache folder: %v", err)
		}
		helmCache = filepath.Join(dir, "cdcrelay", "helm")
	}
	bin := binary(t, "HELM", filepath.Join(helmCache, "v3.22.0", "helm"))
	cmd := exec.Command(bin, append(args, "--kubeconfig", c.kubeconfig)...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(c.dir, "helm/config"),
		"HELM_CACHE_HOME="+filepath.Join(c.dir, "helm/cache"),
		"HELM_DATA_HOME="+filepath.Join(c.dir, "helm/data"))
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
