"""A fork server for the training-CLI tests (tests/cli_fork.py starts one per pytest worker).

A fresh `python -m mshelpers.train` spends about 4.5 s importing MindSpore and mindformers (nltk among them)
before it trains for a few seconds. This server imports them once, then forks one child per request; the child
is the CLI process from that point on: `mshelpers.train_cli.main(argv, cli_process=True)` installs the CLI's own
signal handling and quiet log (the fork left no other thread), with stdout and stderr in files and the exit
code that `python -m` would give. MindSpore reads GLOG_v at import, so the server sets what the CLI would.

Protocol, one JSON line each way: {"argv": [...], "cwd": str, "stdout": path, "stderr": path} in;
{"pid": n} when the child starts, then {"rc": n} when it ends (negative: killed by that signal, as Popen).
"""
import json
import os
import sys

os.environ.setdefault("GLOG_v", "4")
os.environ.setdefault("GLOG_logtostderr", "1")
import mshelpers  # noqa: E402,F401  (first: its filter of mindformers' import noise)
import mindspore  # noqa: E402,F401
import mindformers  # noqa: E402,F401
import mshelpers.train_cli as train_cli  # noqa: E402

reply = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)     # nothing but replies on the pipe
reply.write(json.dumps({"ready": os.getpid()}) + "\n")

for line in sys.stdin:
    req = json.loads(line)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.chdir(req["cwd"])
            sys.argv = ["python -m mshelpers.train", *req["argv"]]
            rc = train_cli.main(req["argv"], cli_process=True)
        except SystemExit as e:                      # argparse's refusal, as the CLI would exit
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:                        # as an uncaught exception would: traceback, exit 1
            import traceback
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)     # not the server's atexit handlers: they belong to the server
    os.close(out)
    os.close(err)
    reply.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
