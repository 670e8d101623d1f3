#!/usr/bin/env python3
"""Lists the Rust functions of the tracked sources longer than LIMIT lines (default 120),
longest first: lines from the `fn` line to its closing brace, braces matched outside
strings, chars and line comments. Usage: tools/dev/function_lengths.py [LIMIT] [ROOT]."""
import os
import re
import subprocess
import sys

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')


def code_of(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split('//')[0]


def lengths(root):
    files = subprocess.run(['git', '-C', root, 'ls-files', '*.rs'], capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        lines = open(os.path.join(root, f), encoding='utf-8').read().split('\n')
        for i, line in enumerate(lines):
            m = FN.match(line)
            if not m:
                continue
            depth, started, j = 0, False, i
            while j < len(lines):
                code = code_of(lines[j])
                if not started and ';' in code and '{' not in code:
                    break  # a declaration without a body
                for c in code:
                    if c == '{':
                        depth, started = depth + 1, True
                    elif c == '}':
                        depth -= 1
                if started and depth <= 0:
                    break
                j += 1
            if started:
                yield j - i + 1, f, i + 1, m.group(7)


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    root = sys.argv[2] if len(sys.argv) > 2 else '.'
    over = sorted((x for x in lengths(root) if x[0] > limit), reverse=True)
    for n, f, line, name in over:
        print(f'{n:5} {f}:{line} {name}')
    print(f'{len(over)} functions over {limit} lines')


if __name__ == '__main__':
    main()
