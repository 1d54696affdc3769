"""Security of what the operator runs and says, end to end on the real control plane.

One operator (its own least-privilege identity, a database role that needs its password) serves
a git bundle read with a token and an S3 bundle read with a secret key, in a namespace that
enforces Pod Security ``restricted``. Then:

* its probe Jobs' pods are admitted and run there, and a Job whose pod breaks ``restricted`` is
  refused in the same namespace (the control that admission really enforces);
* the Jobs' and the live pods' specs: no token, the no-permission probe account (bound by no
  role), non-root, read-only root, no capabilities, ``RuntimeDefault`` seccomp, limits, a deadline;
* the planted git token, S3 secret key and database password appear in no operator log line,
  Event, bundle status, Job or pod spec, pod log, nor any process's argv while probing
  (``/proc/*/cmdline`` sampled) — also on the failure paths where a secret could slip into an
  error message: a wrong token, a wrong S3 key, a git URL carrying a password, a wrong database
  password;
* the running operator's artifact server refuses a probe Job's signed URL once tampered with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.manifests import bundle_manifest
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.kube import names
from tests.e2e.operator_env import (
    Operator,
    apply,
    condition,
    git_bundle,
    handler_spec,
    probe_jobs,
    seed_dags,
    start_operator,
    wait_ready,
    wait_status,
)
from tests.e2e.security_support import (
    CmdlineSampler,
    as_pod,
    leaks,
    password_role,
    planted,
    probe_account_bindings,
    psa_dry_run,
    restriction_problems,
    unrestricted_job,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import (
    HTTP_USER,
    PLANTED_PASSWORD,
    PLANTED_TOKEN,
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    GitRepo,
    HttpServer,
    S3Server,
    bucket_name,
)

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]


def secret(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }


def s3_bundle(namespace: str, name: str, s3: S3Server, bucket: str, secret_name: str) -> Any:
    source = {
        "s3": {
            "bucket": bucket,
            "prefix": "ts",
            "endpoint": s3.endpoint,
            "secretRef": {"name": secret_name},
        }
    }
    return bundle_manifest(namespace, name, language="typescript", source=source, queues=[name])


def source_failed(status: dict[str, Any]) -> bool:
    return (condition(status, "SourceReady") or {}).get("status") == "False"


def kubectl_json(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def fetch_status(url: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_probe_pods_are_restricted_tokenless_and_no_secret_leaks(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    pg_server: PostgresServer,
    git_repo: GitRepo,
    source_http: HttpServer,
    s3_server: S3Server,
    runtime_factory: RuntimeFactory,
    tmp_path: Path,
) -> None:
    db_password = planted("db-password")
    wrong_token = planted("wrong-token")
    wrong_s3 = planted("wrong-s3-secret")
    userinfo = planted("userinfo")
    s3_userinfo = planted("s3-userinfo")
    presigned = planted("presigned")
    secrets_ = [
        PLANTED_TOKEN,
        S3_SECRET_KEY,
        db_password,
        wrong_token,
        wrong_s3,
        userinfo,
        s3_userinfo,
        presigned,
    ]
    everything = [*secrets_, PLANTED_PASSWORD]  # the namespace fixture's git Secret as well
    database = password_role(pg_server, migrated, db_password)

    seed_dags(migrated, {"orders": [("extract", "sec-go"), ("publish", "sec-ts")]})
    go = Path(runtime_factory("go", spec=handler_spec(("orders", "extract")))).read_bytes()
    ts = Path(runtime_factory("typescript", spec=handler_spec(("orders", "publish")))).read_bytes()
    git_repo.commit({"go/extract": go}, "go")
    (git_repo.work / "go/extract").chmod(0o755)
    git_repo.commit({}, "executable")
    bucket = bucket_name()
    s3_server.put(bucket, {"ts/publish.min.mjs": ts}, create=True)
    url = git_repo.http_url(source_http)

    apply(
        kube_cluster,
        secret(namespace, "git-token", {"username": HTTP_USER, "token": PLANTED_TOKEN}),
    )
    apply(
        kube_cluster,
        secret(
            namespace, "s3-auth", {"accessKeyID": S3_ACCESS_KEY, "secretAccessKey": S3_SECRET_KEY}
        ),
    )
    gitb = git_bundle(namespace, "sec-go", language="go", url=url, path="go", queues=["sec-go"])
    gitb["spec"]["source"]["git"]["secretRef"]["name"] = "git-token"

    workdir = tmp_path / "operator"
    workdir.mkdir()
    op: Operator = start_operator(kube_cluster, [namespace], database, workdir)
    try:
        with CmdlineSampler(everything) as sampler:
            apply(kube_cluster, gitb)
            apply(kube_cluster, s3_bundle(namespace, "sec-ts", s3_server, bucket, "s3-auth"))
            wait_ready(kube_cluster, namespace, "sec-go", op)
            wait_ready(kube_cluster, namespace, "sec-ts", op)

            # Failure paths: where a secret could slip into an error message.
            apply(
                kube_cluster,
                secret(namespace, "git-wrong", {"username": HTTP_USER, "token": wrong_token}),
            )
            wrong = git_bundle(
                namespace, "sec-wrong", language="go", url=url, path="go", queues=["sec-wrong"]
            )
            wrong["spec"]["source"]["git"]["secretRef"]["name"] = "git-wrong"
            apply(kube_cluster, wrong)
            apply(
                kube_cluster,
                secret(
                    namespace,
                    "s3-wrong",
                    {"accessKeyID": S3_ACCESS_KEY, "secretAccessKey": wrong_s3},
                ),
            )
            s3_wrong = s3_bundle(namespace, "sec-s3-wrong", s3_server, bucket, "s3-wrong")
            apply(kube_cluster, s3_wrong)
            with_userinfo = url.replace("http://", f"http://{HTTP_USER}:{userinfo}@")
            inline = git_bundle(
                namespace,
                "sec-inline",
                language="go",
                url=with_userinfo,
                path="go",
                queues=["sec-inline"],
            )
            del inline["spec"]["source"]["git"]["secretRef"]
            s3_inline = s3_bundle(namespace, "sec-s3-inline", s3_server, bucket, "s3-auth")
            s3_inline["spec"]["source"]["s3"]["endpoint"] = s3_server.endpoint.replace(
                "http://", f"http://{S3_ACCESS_KEY}:{s3_userinfo}@"
            )
            del s3_inline["spec"]["source"]["s3"]["secretRef"]
            # A presigned-style URL (the secret in the query) to a file that is not there.
            query = git_bundle(
                namespace, "sec-query", language="go", url=url, path="go", queues=["sec-query"]
            )
            query["spec"]["source"] = {
                "http": {
                    "url": f"{source_http.base}/files/absent/b.tgz?X-Amz-Signature={presigned}",
                    "sha256": "0" * 64,
                    "secretRef": {"name": "git-token"},
                }
            }
            apply(kube_cluster, query)
            for invalid in (inline, s3_inline):
                applied = kube_cluster.kubectl(
                    "apply", "-f", "-", input=json.dumps(invalid), check=False
                )
                # The CRD takes any string as a URL: the operator must refuse it, quietly.
                assert applied.returncode == 0, applied.stderr
                assert not leaks(applied.stdout + applied.stderr, everything), applied.stderr
            failed = {
                name: wait_status(
                    kube_cluster, namespace, name, op, "SourceReady=False", source_failed
                )
                for name in ("sec-wrong", "sec-s3-wrong", "sec-query")
            }
            for name in ("sec-inline", "sec-s3-inline"):
                failed[name] = wait_status(
                    kube_cluster,
                    namespace,
                    name,
                    op,
                    "Stalled",
                    lambda s: (condition(s, "Stalled") or {}).get("status") == "True",
                )
                stalled = condition(failed[name], "Stalled") or {}
                assert stalled.get("reason") == "InvalidSpec", stalled
                assert "credentials" in stalled.get("message", ""), stalled
            for name in ("sec-wrong", "sec-s3-wrong"):
                reason = (condition(failed[name], "SourceReady") or {}).get("reason")
                assert reason == "AuthenticationFailed", (name, failed[name])

            # A wrong database password, from the same command line the chart's migration
            # Job runs (the URL in a file, as the chart mounts it).
            url_file = tmp_path / "db-url"
            url_file.write_text(database.replace(db_password, wrong_token))
            checked = subprocess.run(
                [
                    str(Path(sys.executable).parent / "taskhandler-operator"),
                    "db",
                    "check",
                    "--url-file",
                    str(url_file),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={k: v for k, v in os.environ.items() if not k.startswith("THOP_")},
            )
        assert checked.returncode != 0, checked.stdout
        assert "password authentication failed" in checked.stderr, checked.stderr
        assert not leaks(checked.stdout + checked.stderr, everything), checked.stderr

        # -- Pod Security restricted, enforced by the apiserver ------------------------------
        labels = kubectl_json(kube_cluster, "namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
        jobs = probe_jobs(kube_cluster, namespace)
        assert len(jobs) == 2, jobs  # one per artifact: go from git, typescript from S3
        job_objs = [kubectl_json(kube_cluster, "job", j, "-n", namespace) for j in jobs]
        pods = kubectl_json(
            kube_cluster, "pods", "-n", namespace, "-l", f"{names.LABEL_NAME}={names.PROBE_APP}"
        )["items"]
        assert sorted(p["metadata"]["labels"]["job-name"] for p in pods) == jobs
        for pod in pods:  # admitted, and ran to the end
            assert pod["status"]["phase"] == "Succeeded", pod["status"]
        for job in job_objs:
            template = job["spec"]["template"]
            assert (
                psa_dry_run(kube_cluster, as_pod(namespace, "psa-check", template)).returncode == 0
            )
        control = unrestricted_job(namespace, "unrestricted-control")
        apply(kube_cluster, control)
        refused = psa_dry_run(
            kube_cluster, as_pod(namespace, "control", control["spec"]["template"])
        )
        assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = kubectl_json(
                kube_cluster,
                "events",
                "-n",
                namespace,
                "--field-selector",
                "involvedObject.name=unrestricted-control",
            )["items"]
            failed_create = [e for e in found if e["reason"] == "FailedCreate"]
            if failed_create:
                break
            time.sleep(0.5)
        assert failed_create and "violates PodSecurity" in failed_create[0]["message"], found
        control_pods = kubectl_json(
            kube_cluster, "pods", "-n", namespace, "-l", "job-name=unrestricted-control"
        )["items"]
        assert control_pods == []

        # -- The probe pods: no token, no API identity, restricted ---------------------------
        for job in job_objs:
            spec = job["spec"]
            assert 0 < spec["activeDeadlineSeconds"] <= 600, spec
            assert spec["template"]["metadata"]["labels"][names.LABEL_NAME] == names.PROBE_APP
            assert restriction_problems(spec["template"]["spec"], names.PROBE_APP) == []
        for pod in pods:  # as admitted: no admission plugin added a token volume
            assert restriction_problems(pod["spec"], names.PROBE_APP) == [], pod["spec"]
        account = kubectl_json(kube_cluster, "serviceaccount", names.PROBE_APP, "-n", namespace)
        assert account.get("automountServiceAccountToken") is False
        assert probe_account_bindings(kube_cluster, namespace) == []

        # -- No planted secret anywhere ------------------------------------------------------
        assert sampler.probes == {"fetch", "probe"}, "the sampler saw no probe container"
        assert sampler.hits == [], sampler.hits
        places = {
            "operator log": op.log.read_text(errors="replace"),
            "events": kube_cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout,
            "events.k8s.io": kube_cluster.kubectl(
                "get", "events.events.k8s.io", "-n", namespace, "-o", "json"
            ).stdout,
            "jobs": kube_cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout,
            "pods": kube_cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout,
        }
        for item in kubectl_json(kube_cluster, "thb", "-n", namespace)["items"]:
            places[f"status of {item['metadata']['name']}"] = json.dumps(item.get("status"))
        for pod in pods:
            for container in ("fetch", "probe"):
                logs = kube_cluster.kubectl(
                    "logs", pod["metadata"]["name"], "-c", container, "-n", namespace, check=False
                )
                places[f"log of {pod['metadata']['name']}/{container}"] = logs.stdout
        for path in ("/metrics", "/healthz", "/readyz"):  # unauthenticated endpoints
            with urllib.request.urlopen(
                f"http://127.0.0.1:{op.health_port}{path}", timeout=30
            ) as r:
                places[path] = r.read().decode(errors="replace")
        assert 'taskhandler_operator_leader{shard="default"} 1.0' in places["/metrics"]
        # The revision store on disk (a PVC in a cluster, served to probe pods): no credential
        # kept in a git config, a remote URL or anywhere else.
        stored = [p for p in (workdir / "revisions").rglob("*") if p.is_file()]
        assert len(stored) >= 2, stored
        places["revision store"] = "\n".join(
            p.read_bytes().decode(errors="replace") + str(p) for p in stored
        )
        found_in = {where: leaks(text, everything) for where, text in places.items()}
        assert {k: v for k, v in found_in.items() if v} == {}
        # The failures were logged (so the log had the chance to leak), and nothing stopped.
        for name in ("sec-wrong", "sec-s3-wrong", "sec-inline", "sec-s3-inline", "sec-query"):
            assert name in places["operator log"], name
        assert op.proc.poll() is None, op.tail()

        # -- The running artifact server refuses a probe Job's URL once tampered with --------
        fetch = job_objs[0]["spec"]["template"]["spec"]["initContainers"][0]["command"]
        manifest = json.loads(fetch[fetch.index("--manifest") + 1])
        signed = manifest[0]["url"]
        base, query = signed.split("?", 1)
        signature = query.rsplit("signature=", 1)[1]
        flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
        assert fetch_status(signed, "HEAD") == 200
        assert fetch_status(f"{base}?{query.replace(signature, flipped)}") == 403
        assert fetch_status(base) == 403
        assert fetch_status(base.rsplit("/", 1)[0] + "/../../../etc/passwd?" + query) == 404
        assert fetch_status(signed, "POST") == 405
        assert fetch_status(signed, "DELETE") == 405
        assert fetch_status(signed) == 200  # still served: the refusals deleted nothing
    finally:
        op.stop()
