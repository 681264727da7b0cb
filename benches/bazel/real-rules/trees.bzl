"""Tree artifacts (ctx.actions.declare_directory) and a reader of one."""

def _tree_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    ctx.actions.run_shell(
        outputs = [out],
        inputs = ctx.files.srcs,
        arguments = [out.path] + [f.path for f in ctx.files.srcs],
        # With no srcs the directory stays empty.
        command = "d=$1; shift; mkdir -p \"$d/sub\" && rmdir \"$d/sub\" && for f in \"$@\"; do cp \"$f\" \"$d/\"; done",
        mnemonic = "MakeTree",
    )
    return [DefaultInfo(files = depset([out]))]

tree = rule(
    implementation = _tree_impl,
    attrs = {"srcs": attr.label_list(allow_files = True)},
)

def _dir_digest_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    tree = ctx.file.tree
    ctx.actions.run_shell(
        outputs = [out],
        inputs = [tree],
        arguments = [tree.path, out.path],
        # Fails unless the tree is a directory here, empty or not.
        command = "test -d \"$1\" && (cd \"$1\" && ls -A | sort && cat $(ls -A | sort) </dev/null) > \"$2\"",
        mnemonic = "ReadTree",
    )
    return [DefaultInfo(files = depset([out]))]

dir_digest = rule(
    implementation = _dir_digest_impl,
    attrs = {"tree": attr.label(allow_single_file = True)},
)
