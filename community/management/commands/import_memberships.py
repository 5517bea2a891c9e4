from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from community.services.membership_import import MembershipImportError, memberships_import


class Command(BaseCommand):
    help = (
        "Import community and cohort memberships from a CSV file of lines "
        "'community,<slug>,<user_id>' or 'cohort,<slug>,<user_id>' (a header line is allowed). "
        "The whole file is checked first and imported in one transaction: all or nothing. "
        "Existing memberships are kept; unknown slugs are an error unless --create-groups."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", type=Path, help="The CSV file, or - for standard input.")
        parser.add_argument("--create-groups", action="store_true", help="Create communities and cohorts not found.")

    def handle(self, *args: Any, path: Path, create_groups: bool, **options: Any) -> None:
        try:
            if str(path) == "-":
                report = memberships_import(lines=sys.stdin, create_groups=create_groups)
            else:
                # utf-8-sig: a byte-order mark, as spreadsheets write, is not part of the first field.
                with path.open(newline="", encoding="utf-8-sig") as handle:
                    report = memberships_import(lines=handle, create_groups=create_groups)
        except (MembershipImportError, OSError) as exc:
            raise CommandError(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise CommandError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}: {exc.reason})") from None
        self.stdout.write(f"added {report.added}, already there {report.already}, groups created {report.created}")
