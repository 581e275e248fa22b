"""The code a sandbox child runs first: containment layers, then the user's ``main.py`` as ``__main__``.

``BOOTSTRAP`` is passed as ``python -I -u -B -c BOOTSTRAP <config json>`` by
:class:`~workbench.tools.sandbox.PythonSandbox`. In order it tries a network namespace, sets the resource
limits (soft = hard), drops root to ``nobody`` where the parent allowed it, installs the audit-hook guard,
writes what is in force to the report pipe, then runs the code (echoing a last expression) with the
sandbox's own frames hidden from tracebacks. It is a string, never imported or run in this process.
"""

# Runs in the child as ``python -I -u -B -c BOOTSTRAP <config json>``, before the user's code. Everything
# lives inside one function whose names are deleted before the user's code starts, and the guard takes
# the builtins it needs as default arguments (replacing builtins later does not change the guard).
BOOTSTRAP = r"""
def _sandbox_main():
    import json, os, resource, sys, sysconfig
    config = json.loads(sys.argv[1])
    report = {"network": "guard only", "user": "unchanged"}

    # 1. A network namespace with no interfaces up (needs root, or unprivileged user namespaces).
    if config["network_namespace"]:
        newnet, newuser = 0x40000000, 0x10000000
        unshare = getattr(os, "unshare", None)
        if unshare is None:
            try:
                import ctypes
                libc = ctypes.CDLL(None, use_errno=True)
                def unshare(flags):
                    if libc.unshare(flags) != 0:
                        raise OSError(ctypes.get_errno(), "unshare failed")
            except Exception:
                unshare = None
        for flags, label in ((newnet, "namespace"), (newuser | newnet, "user+network namespace")):
            if unshare is None:
                break
            try:
                unshare(flags)
                report["network"] = label
                break
            except OSError:
                continue
        unshare = libc = None

    # 2. Resource limits (soft = hard, so the code cannot raise them again).
    def limit(which, value, hard=None):
        if value is None:
            return
        _, old_hard = resource.getrlimit(which)
        hard = value if hard is None else hard
        if old_hard != resource.RLIM_INFINITY:
            hard, value = min(hard, old_hard), min(value, old_hard)
        resource.setrlimit(which, (value, hard))
    limits = config["limits"]
    limit(resource.RLIMIT_CPU, limits["cpu"], None if limits["cpu"] is None else limits["cpu"] + 1)
    limit(resource.RLIMIT_AS, limits["memory"])
    limit(resource.RLIMIT_FSIZE, limits["file_size"])
    limit(resource.RLIMIT_NOFILE, limits["open_files"])
    limit(resource.RLIMIT_NPROC, limits["processes"])
    limit(resource.RLIMIT_CORE, 0)

    # 3. Drop root privileges to nobody (the parent checked the interpreter is readable by others).
    drop = config["drop_to"]
    if drop is not None and os.geteuid() == 0 and report["network"] != "user+network namespace":
        os.setgroups([])
        os.setgid(drop[1])
        os.setuid(drop[0])
        report["user"] = "nobody (uid %d)" % drop[0]

    # 4. The guard.
    root = config["root"]
    if config["guard"]:
        import _posixsubprocess
        def _refuse_fork_exec(*args, **kwargs):
            raise PermissionError("sandbox: starting processes is not allowed")
        _posixsubprocess.fork_exec = _refuse_fork_exec  # direct calls bypass subprocess.Popen's audit event
        reads = {root, "/usr/lib", "/usr/lib64", "/usr/share", "/usr/local/lib", "/lib", "/lib64",
                 "/etc/localtime", "/etc/ssl", "/etc/mime.types", "/dev/null", "/dev/zero", "/dev/urandom"}
        for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
            reads.add(os.path.realpath(prefix))
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                reads.add(os.path.realpath(path))
        reads.update(config["read_paths"])
        writes = (root, "/dev/null")
        write_events = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.utime",
                        "os.truncate", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
                        "shutil.rmtree", "os.mkfifo", "os.mknod"}
        denied = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.startfile",
                  "subprocess.Popen", "os.link", "os.symlink", "resource.setrlimit", "resource.prlimit",
                  "gc.get_objects", "gc.get_referrers", "gc.get_referents", "webbrowser.open",
                  "urllib.Request", "http.client.connect", "os.chroot", "os.setns", "os.unshare"}
        denied_prefixes = ("socket.", "pty.", "_winapi.", "winreg.", "ftplib.", "smtplib.",
                           "poplib.", "imaplib.", "nntplib.", "telnetlib.")
        denied_imports = {"_posixsubprocess"}
        # ctypes may be imported (pandas and sympy do) but not load libraries, look up symbols,
        # call foreign functions by address or read memory at an address.
        denied_ctypes = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
                         "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.call_function"}
        write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        o_path = getattr(os, "O_PATH", 0)

        def guard(event, args, _reads=tuple(sorted(reads)), _writes=writes, _root=root,
                  _write_events=frozenset(write_events), _denied=frozenset(denied),
                  _denied_prefixes=denied_prefixes, _denied_imports=frozenset(denied_imports),
                  _denied_ctypes=frozenset(denied_ctypes),
                  _write_flags=write_flags, _o_path=o_path, _pid=os.getpid(), _getcwd=os.getcwd,
                  _fspath=os.fspath, _fsdecode=os.fsdecode, _stat=os.stat, _isinstance=isinstance,
                  _str=str, _int=int, _PermissionError=PermissionError, _ImportError=ImportError):
            def absolute(path):
                try:
                    path = _fspath(path)
                except TypeError:
                    return None
                if _isinstance(path, bytes):
                    path = _fsdecode(path)
                if not path.startswith("/"):
                    path = _getcwd() + "/" + path
                parts = []
                for part in path.split("/"):
                    if part == "" or part == ".":
                        continue
                    if part == "..":
                        if parts:
                            parts.pop()
                        continue
                    parts.append(part)
                return "/" + "/".join(parts)

            def within(path, roots):
                for r in roots:
                    if path == r or path.startswith(r + "/"):
                        return True
                return False

            def refuse(what):
                raise _PermissionError("sandbox: " + what + " is not allowed")

            if event == "open":
                path, mode, flags = args
                if path is None or _isinstance(path, _int):
                    return
                where = absolute(path)
                if where is None:
                    return
                writing = (_isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode
                           or "+" in mode)) or (_isinstance(flags, _int) and flags & _write_flags)
                if writing:
                    if not within(where, _writes):
                        refuse("writing " + where + " (outside the sandbox directory)")
                    return
                if not within(where, _reads):
                    refuse("reading " + where)
                if mode is None and not within(where, (_root,)):
                    if _isinstance(flags, _int) and flags & _o_path:
                        refuse("opening " + where + " with O_PATH")
                    try:
                        is_dir = (_stat(where).st_mode & 0o170000) == 0o040000
                    except OSError:
                        is_dir = False
                    if is_dir:
                        refuse("opening the directory " + where)
                return
            if event in _write_events:
                paths = args[:2] if event == "os.rename" else args[:1]
                for path in paths:
                    if path is None or _isinstance(path, _int):
                        continue
                    where = absolute(path)
                    if where is not None and not within(where, _writes):
                        refuse(event + " on " + where + " (outside the sandbox directory)")
                return
            if event == "import":
                if args[0] in _denied_imports:
                    raise _ImportError("sandbox: importing " + args[0] + " is not allowed")
                return
            if event == "socket.__new__":
                if args[1:2] == (1,):  # AF_UNIX (socket pairs: asyncio's wake-up pipe)
                    return
                refuse("network access (socket.__new__)")
            if event in ("os.kill", "os.killpg"):
                if args[0] != _pid:
                    refuse("signalling another process")
                return
            if event.startswith("ctypes."):
                if event == "ctypes.dlopen" and args[0] is None:  # the interpreter itself, at import
                    return
                if event in _denied_ctypes:
                    refuse(event)
                return
            if event.startswith("socket."):
                refuse("network access (" + event + ")")
            if event in _denied or event.startswith(_denied_prefixes):
                refuse(event)

        sys.addaudithook(guard)
        guard = None
        report["guard"] = True

    # 5. Report what is in force, then run the user's code as __main__.
    with os.fdopen(config["report_fd"], "w") as pipe:
        pipe.write(json.dumps(report))
    import ast, builtins, traceback, types
    path = os.path.join(root, "main.py")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    echo = config["echo"]
    del config, report, limits, drop
    for name in [n for n in globals() if not n.startswith("__")]:
        del globals()[name]
    try:
        tree = ast.parse(source, "main.py")  # relative (cwd): no random directory in a traceback
        last = None
        if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "main.py", "exec"), module.__dict__)
        if last is not None:
            value = eval(compile(last, "main.py", "eval"), module.__dict__)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next
        report = traceback.TracebackException(type(error), error, tb)
        inner = ("guard", "refuse", "absolute", "within", "_refuse_fork_exec")
        report.stack = traceback.StackSummary.from_list(
            [f for f in report.stack if not (f.filename == "<string>" and f.name in inner)]
        )
        sys.stderr.write("".join(report.format()))
        sys.stderr.flush()
        os._exit(1)
_sandbox_main()
"""
