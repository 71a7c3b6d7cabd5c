"""The web page's languages: Simplified Chinese (``zh-CN``) and English (``en``), with gettext catalogs (Babel).

The English text in the templates, in ``static/*.js`` and in the :func:`N_`-marked constants of this package is
the message id; ``locale/zh_CN/LC_MESSAGES/messages.po`` gives its Chinese. The ``.po`` file is compiled in
memory when the module loads (Babel's ``read_po`` + ``write_mo``), so a fresh ``pip install -e .`` needs no
build step and a catalog edit shows at the next start (issue 29, part 1).

Which language a request gets (:func:`choose`): the ``lang`` cookie the page's switch sets (``/lang/<code>``),
else the ``web.language`` setting, whose ``auto`` (the default) reads ``Accept-Language``; English when nothing
matches. The live page's JavaScript gets its strings as JSON (:func:`js_catalog`: every message whose location
is a ``.js`` file), looked up by its ``_()``.

Refreshing the catalog after a text change (developers): ``pybabel extract -F babel.cfg -o /tmp/m.pot
src/feiqiu_etl/web`` then ``pybabel update -i /tmp/m.pot -d src/feiqiu_etl/web/locale``; tests/unit/test_web_i18n.py
fails while a message has no translation.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Mapping

from babel import Locale
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import NullTranslations, Translations

HERE = Path(__file__).parent
LOCALE_DIR = HERE / "locale"
LANGUAGES = ("zh-CN", "en")
"""What the page speaks; the first is what ``Accept-Language: zh`` (any Chinese) gets."""
DEFAULT = "en"
COOKIE = "lang"
SETTING_CHOICES = ("auto", "zh-CN", "en")
_ALIASES = {"zh": "zh-CN", "zh-cn": "zh-CN", "zh_cn": "zh-CN", "zh-hans": "zh-CN", "en": "en", "en-us": "en",
            "en-gb": "en", "auto": "auto"}
NAMES = {"zh-CN": "中文", "en": "English"}
"""Each language's name in itself (the switch)."""


def N_(message: str) -> str:
    """Marks a constant for the catalog (extracted by Babel); translated where it is shown."""
    return message


def normalise(code: str | None) -> str | None:
    """``zh``, ``zh_CN``, ``zh-Hans`` → ``zh-CN``; ``en-US`` → ``en``; anything else None."""
    if not code:
        return None
    return _ALIASES.get(code.strip().lower().replace("_", "-"))


def _catalog_path(language: str) -> Path:
    return LOCALE_DIR / language.replace("-", "_") / "LC_MESSAGES" / "messages.po"


@functools.lru_cache(maxsize=None)
def _catalog(language: str):
    with _catalog_path(language).open("rb") as fh:
        return read_po(fh, locale=language.replace("-", "_"))


@functools.lru_cache(maxsize=None)
def translations(language: str) -> NullTranslations:
    """The gettext translations of ``language`` (English: the message ids themselves)."""
    if language == DEFAULT:
        return NullTranslations()
    buf = io.BytesIO()
    write_mo(buf, _catalog(language))
    buf.seek(0)
    return Translations(buf)


@functools.lru_cache(maxsize=None)
def js_catalog(language: str) -> Mapping[str, str]:
    """``{English: translation}`` of every message used by ``static/*.js`` (empty for English)."""
    if language == DEFAULT:
        return {}
    return {m.id: m.string for m in _catalog(language)
            if m.id and m.string and any(str(loc[0]).endswith(".js") for loc in m.locations)}


def untranslated(language: str) -> list[str]:
    """Message ids of ``language``'s catalog with no translation or a fuzzy one (tests)."""
    return [m.id for m in _catalog(language) if m.id and (not m.string or m.fuzzy)]


def gettext(language: str, message: str) -> str:
    return translations(language).gettext(message)


def from_accept_language(header: str | None) -> str | None:
    """The best of :data:`LANGUAGES` for an ``Accept-Language`` header (q-values honoured), None if none fits."""
    if not header:
        return None
    wanted = []
    for i, part in enumerate(header.split(",")):
        code, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        if code and q > 0:
            wanted.append((-q, i, code.strip()))
    for _, _, code in sorted(wanted):
        exact = normalise(code)
        if exact and exact != "auto":
            return exact
        try:
            lang = Locale.parse(code, sep="-").language
        except (ValueError, TypeError, Exception):  # noqa: BLE001 - an odd tag is simply not matched
            continue
        if lang == "zh":
            return "zh-CN"
        if lang == "en":
            return "en"
    return None


def choose(cookie: str | None, setting: str, accept_language: str | None) -> str:
    """The request's language: the switch's cookie, else ``setting`` (``auto``: ``Accept-Language``), else
    English."""
    chosen = normalise(cookie)
    if chosen in LANGUAGES:
        return chosen
    configured = normalise(setting) or "auto"
    if configured != "auto":
        return configured
    return from_accept_language(accept_language) or DEFAULT
