"""Synthetic junk of the kinds web crawls are full of (docs/methods.md §7 (TinyStories filter audit)): navigation, spam, repeated lines, fragments.

Each generator takes a ``random.Random``, the language and the source's ``Material`` and returns one plain-text
page; English and Chinese variants (``language="zh"`` gives Chinese, anything else English). Pages mix fixed
templates with sentences taken from the source's own originals, so they are not trivially separable from it by
vocabulary alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_VOCAB_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_VOCAB_PUNCT = "\"'()[]{}<>.,;:!?«»“”‘’`"

_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
_SITES = ["Northwind Traders", "Bluefield Media", "OpenHarbor", "Crestline Outdoor", "Tech Digest Daily",
          "Maple Street Bakery", "Riverside Library", "Acme Cloud Hosting"]
_MENU = ["Home", "About us", "Products", "Solutions", "Pricing", "Blog", "News", "Events", "Support", "Contact us",
         "Careers", "Sign in", "Register", "Search", "Shop", "FAQ", "Downloads", "Community", "Partners", "Press"]
_FOOTER = ["Privacy Policy | Terms of Service | Cookie Preferences | Sitemap",
           "Follow us on Facebook, Twitter, LinkedIn and YouTube",
           "Subscribe to our newsletter", "Back to top", "Accessibility statement",
           "Do not sell my personal information"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]

_SPAM_ITEMS = ["cheap viagra", "replica watches", "online casino", "payday loans", "bitcoin doubler",
               "weight loss pills", "free followers", "designer handbags", "cheap essay writing"]
_SPAM_LINES = ["Buy {kw} online at the lowest price!", "Best {kw} {kw2} cheap {kw} free shipping worldwide",
               "CLICK HERE >>> www.{site}-deals.biz <<< CLICK HERE", "Limited offer!!! Get {pct}% off {kw} today only",
               "{kw} {kw} {kw} {kw2} {kw2}", "100% guaranteed {kw}, no prescription, no credit check",
               "Order now and win a FREE iPhone!!! {kw} {kw2}", "#1 {kw} store ### top rated ### {kw2}",
               "Act now... offer expires soon... {kw}..."]

_ZH_SITES = ["北方商贸网", "蓝田资讯", "开源港", "晨光户外", "科技日报在线", "枫林书屋", "江畔图书馆"]
_ZH_MENU = ["首页", "关于我们", "产品中心", "解决方案", "新闻动态", "客户案例", "服务支持", "联系我们", "人才招聘",
            "登录", "注册", "搜索", "在线商城", "常见问题", "下载中心", "合作伙伴", "网站地图"]
_ZH_FOOTER = ["隐私政策 | 使用条款 | 友情链接 | 网站地图", "版权所有 © 2024 {site} 保留所有权利", "京ICP备12345678号",
              "关注我们的微信公众号", "返回顶部", "客服热线：400-123-4567"]
_ZH_SPAM_ITEMS = ["免费领取", "日赚千元", "低价出售", "澳门赌场", "代开发票", "减肥神药", "刷单兼职", "高仿名表"]
_ZH_SPAM_LINES = ["{kw}！{kw}！点击进入{kw2}官网", "加微信领取{kw}，名额有限，先到先得！！！", "{kw}{kw}{kw}{kw2}{kw2}",
                  "限时优惠{pct}折，{kw}马上抢购", "百分百正品{kw}，支持货到付款，{kw2}", "点击这里>>>www.{site}.cc<<<{kw}"]
_ZH_REPEATED = ["本页面已移动，请更新您的书签。", "系统繁忙，请稍后再试。", "该内容仅对会员开放，请先登录。"]
_REPEATED = ["This page has moved. Please update your bookmarks.", "ERROR: connection timed out (retrying)",
             "Please enable JavaScript to view this page.", "Item added to your cart."]
_FRAGMENTS = ["Click here to read more.", "Page not found", "Loading...", "Share this:", "Read more", "Next page",
              "Posted by admin", "Leave a comment", "Skip to content", "Accept all cookies"]
_ZH_FRAGMENTS = ["点击查看更多", "加载中……", "返回顶部", "上一篇", "下一篇", "发表评论", "分享到微信", "页面不存在"]


@dataclass(frozen=True)
class Material:
    """The source's originals (plain text) and their vocabulary: words, or CJK characters for Chinese."""

    originals: list[str]
    vocab: list[str]


def navigation_page(rng: random.Random, language: str, material: Material) -> str:
    """Menu, breadcrumb, sidebar of post titles, archive months, pagination and footer; 30–90 short lines."""
    if language == "zh":
        return _zh_navigation(rng, material)
    site = rng.choice(_SITES)
    menu = rng.sample(_MENU, rng.randint(6, 14))
    titles = [_opening(rng, material, rng.randint(3, 8)) for _ in range(rng.randint(5, 12))]
    year = rng.randint(2015, 2024)
    months = [f"{m} {year}" for m in rng.sample(_MONTHS, rng.randint(4, 12))]
    lines = [site, *menu, f"Home > {rng.choice(menu)} > {titles[0]}", "Recent posts", *titles, "Archives", *months,
             "« Previous 1 2 3 4 5 … 12 Next »", *rng.sample(_FOOTER, rng.randint(3, len(_FOOTER))),
             f"© {year} {site}. All rights reserved."]
    return "\n".join(lines)


def _zh_navigation(rng: random.Random, material: Material) -> str:
    site = rng.choice(_ZH_SITES)
    menu = rng.sample(_ZH_MENU, rng.randint(6, 12))
    titles = [_opening(rng, material, rng.randint(6, 14), by_chars=True) for _ in range(rng.randint(5, 12))]
    year = rng.randint(2015, 2024)
    months = [f"{year}年{m}月" for m in sorted(rng.sample(range(1, 13), rng.randint(4, 12)))]
    footer = [f.format(site=site) for f in rng.sample(_ZH_FOOTER, rng.randint(3, len(_ZH_FOOTER)))]
    lines = [site, *menu, f"首页 > {rng.choice(menu)} > 正文", "最新文章", *titles, "文章归档", *months,
             "上一页 1 2 3 4 5 … 12 下一页", *footer]
    return "\n".join(lines)


def spam_page(rng: random.Random, language: str, material: Material) -> str:
    """Keyword-stuffed advertising: 12–40 lines from templates around one or two product keywords."""
    zh = language == "zh"
    items, templates = (_ZH_SPAM_ITEMS, _ZH_SPAM_LINES) if zh else (_SPAM_ITEMS, _SPAM_LINES)
    kw, kw2 = rng.sample(items, 2)
    site = rng.choice(["bestdeal", "megasale", "luckywin", "topshop"])
    lines = [rng.choice(templates).format(kw=kw, kw2=kw2, pct=rng.choice([50, 70, 80, 90]), site=site)
             for _ in range(rng.randint(12, 40))]
    return "\n".join(lines)


def repeated_page(rng: random.Random, language: str, material: Material) -> str:
    """One to three lines (a notice, or a sentence of the source) repeated 10–40 times, with a few unique lines
    (comment headers) among them: a scraped page whose template or widget repeated."""
    zh = language == "zh"
    pool = _ZH_REPEATED if zh else _REPEATED
    lines = [rng.choice(pool) if rng.random() < 0.5 else _sentence(rng, material, zh)
             for _ in range(rng.randint(1, 3))]
    body = [rng.choice(lines) for _ in range(rng.randint(10, 40))]
    for k in range(rng.randint(1, 4)):
        header = f"{rng.randint(1, 28)}楼 用户{rng.randint(100, 9999)} 回复" if zh else \
            f"Comment #{k + 1} by user{rng.randint(100, 9999)}"
        body.insert(rng.randrange(len(body) + 1), header)
    return "\n".join(body)


def short_fragment(rng: random.Random, language: str, material: Material) -> str:
    """A UI string, or the first 2–12 words (5–30 characters for Chinese) of a random original."""
    if rng.random() < 0.5:
        return rng.choice(_ZH_FRAGMENTS if language == "zh" else _FRAGMENTS)
    text = rng.choice(material.originals)
    if language == "zh":
        return "".join(text.split())[: rng.randint(5, 30)]
    return " ".join(text.split()[: rng.randint(2, 12)])


def _sentence(rng: random.Random, material: Material, by_chars: bool) -> str:
    """A random sentence (split at . ! ? or 。！？) of a random original, at most 200 characters."""
    text = rng.choice(material.originals)
    parts = [p.strip() for p in _SENTENCE_END_RE.split(text) if len(p.strip()) > (5 if by_chars else 20)]
    return (rng.choice(parts) if parts else " ".join(text.split()))[:200]


def _opening(rng: random.Random, material: Material, n: int, by_chars: bool = False) -> str:
    """The first ``n`` words (characters when ``by_chars``) of a random sentence of the source: a post title."""
    sentence = _sentence(rng, material, by_chars)
    return "".join(sentence.split())[:n] if by_chars else " ".join(sentence.split()[:n])


def vocabulary(texts: list[str], by_chars: bool) -> list[str]:
    """Sorted distinct substitution units: CJK characters when ``by_chars``, else alphabetic words (punctuation
    stripped); falls back to every non-space character / token so the list is never empty for non-empty text."""
    if by_chars:
        units = {c for t in texts for c in _VOCAB_CJK_RE.findall(t)} or {c for t in texts for c in t if not c.isspace()}
    else:
        tokens = {w.strip(_VOCAB_PUNCT) for t in texts for w in t.split()}
        units = {w for w in tokens if w.isalpha()} or {w for w in tokens if w}
    return sorted(units)


GENERATORS = {"navigation": navigation_page, "spam": spam_page, "repeated": repeated_page, "short": short_fragment}
