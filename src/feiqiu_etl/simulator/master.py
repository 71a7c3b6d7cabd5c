"""Builders for master data (the 9 snapshot tasks of upstream-api.md §4.1) of one simulated store.

What it is for: one function per record type returning a complete record with every field of §4.2, §4.3, §4.8–
§4.11, §4.14, §4.16 and §4.20 (plus the detail-only parts of §5.3/§5.4), used both by the initial generation and by
``Dataset.insert``. What it must never do: draw randomness from anywhere but ``store.rng``/``store.faker``, or write
``null`` into a record (Q6: ``""`` means no value, ``0`` means no reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from feiqiu_etl.simulator.state import Record, Store, record
from feiqiu_etl.simulator.values import (
    NICKNAMES,
    REMARKS,
    cents,
    digits,
    ean13,
    fmt_date,
    masked_phone,
    money,
)

AREA_NAMES = ("大厅", "VIP包厢区", "斯诺克区", "美式九球区", "二楼散台区", "【夜场】专区", "比赛区（Pro）", "包厢B区",
              "三楼教学区", "露台区")
TABLE_TYPES = {"CN8": "中式八球", "SNOOKER": "斯诺克", "POOL9": "美式九球"}
TABLE_PRICES = {"CN8": (38, 45, 48, 58), "SNOOKER": (68, 78, 88), "POOL9": (35, 40, 42)}
PRICE_RULES = {"CN8": "中式八球标准价", "SNOOKER": "斯诺克（按小时）", "POOL9": "美式九球标准价"}

CATEGORY_TREE = (
    ("饮料", ("碳酸饮料", "功能饮料", "矿泉水/纯净水", "茶饮（瓶装）")),
    ("零食", ("膨化食品", "坚果炒货", "糖果巧克力")),
    ("酒水", ("啤酒", "洋酒")),
    ("香烟", ()),
    ("台球用品", ("巧粉/皮头", "球杆配件")),
    ("餐食", ("夜宵", "果盘")),
    ("其他", ()),
)

GOODS_CATALOG = (  # name, unit, price, category
    ("红牛🐂 250ml", "罐", "8", "功能饮料"), ("农夫山泉 550ml", "瓶", "4", "矿泉水/纯净水"),
    ("可口可乐 330ml", "罐", "5", "碳酸饮料"), ("东鹏特饮 500ml", "瓶", "6", "功能饮料"),
    ("脉动（青柠味）600ml", "瓶", "6", "功能饮料"), ("王老吉 310ml", "罐", "6", "茶饮（瓶装）"),
    ("百岁山 570ml", "瓶", "5", "矿泉水/纯净水"), ("元气森林（白桃）", "瓶", "7", "碳酸饮料"),
    ("康师傅冰红茶 500ml", "瓶", "4", "茶饮（瓶装）"), ("雪碧 330ml", "罐", "5", "碳酸饮料"),
    ("百威啤酒 330ml", "瓶", "12", "啤酒"), ("青岛纯生 500ml", "瓶", "10", "啤酒"), ("科罗娜 355ml", "瓶", "15", "啤酒"),
    ("芝华士12年（杯）", "杯", "48", "洋酒"), ("乐事薯片 75g", "包", "8", "膨化食品"), ("士力架 51g", "条", "6", "糖果巧克力"),
    ("洽洽瓜子 260g", "袋", "12", "坚果炒货"), ("卫龙辣条", "包", "4", "膨化食品"), ("旺旺雪饼", "包", "5", "膨化食品"),
    ("德芙巧克力", "块", "9.5", "糖果巧克力"), ("中华（软）", "包", "70", "香烟"), ("黄鹤楼（硬）", "包", "25", "香烟"),
    ("利群（新版）", "包", "18", "香烟"), ("芙蓉王", "包", "25", "香烟"), ("巧粉（蓝）", "块", "10", "巧粉/皮头"),
    ("皮头 13mm", "个", "30", "巧粉/皮头"), ("三指手套", "只", "20", "球杆配件"), ("球杆保养油", "瓶", "35", "球杆配件"),
    ("夜宵套餐🍜", "份", "38", "夜宵"), ("果盘（大）", "份", "48", "果盘"), ("果盘（小）", "份", "28", "果盘"),
    ("炒饭（扬州）", "份", "22", "夜宵"), ("泡面加蛋", "份", "12", "夜宵"), ("槟榔 🐂", "包", "20", "其他"),
    ("口香糖", "瓶", "12.5", "糖果巧克力"),
)
GOODS_VARIANTS = ("冰镇", "常温", "大份", "小份", "新品", "限定")

ASSISTANT_NAMES = ("小雅", "可可🎱", "婷婷", "安琪", "木子", "甜甜🍬", "Coco", "晓月", "阿紫", "小鹿", "诗诗", "糖糖",
                   "七七", "阿楠", "Mia", "小狐狸🦊", "依依", "朵朵", "小曼", "星星✨")
ASSISTANT_LEVELS = (("初级", 80), ("中级", 100), ("高级", 120), ("金牌", 150))
SKILLS = ("中式八球", "斯诺克", "美式九球", "花式表演", "教学")

MEMBER_LEVELS = ((1, "普通会员", "1.00"), (2, "银卡会员", "0.95"), (3, "金卡会员", "0.88"), (4, "钻石会员", "0.80"))
MEMBER_TAGS = ((1, "夜场常客", "#6F42C1"), (2, "斯诺克爱好者", "#0D6EFD"), (3, "高消费", "#DC3545"), (4, "学生", "#20C997"),
               (5, "团购客", "#FD7E14"), (6, "生日月🎂", "#D63384"), (7, "周末党", "#198754"))
REGISTER_SOURCES = ("STORE", "STORE", "MINIAPP", "MINIAPP", "MEITUAN", "DOUYIN")

CARD_TYPES = ((11, "充500送100储值卡", "STORED_VALUE"), (12, "充1000送300储值卡", "STORED_VALUE"),
              (15, "充200储值卡", "STORED_VALUE"), (13, "金卡88折卡", "DISCOUNT"), (14, "10次畅打次卡", "TIMES"))

PACKAGE_TEMPLATES = (  # name, type, sale, original, minutes, weekdays, time range, goods contents, assistant minutes
    ("【工作日】中式台球畅打2小时", "TABLE_TIME", "39.90", "96.00", 120, (1, 2, 3, 4, 5), "10:00-18:00", (), 0),
    ("🎱夜场双人套餐 3小时+2瓶饮料", "TABLE_GOODS", "88", "160.00", 180, (1, 2, 3, 4, 5, 6, 7), "18:00-02:00",
     (("农夫山泉 550ml", 2),), 0),
    ("斯诺克1小时体验（不限时段）", "TABLE_TIME", "29.9", "68.00", 60, (1, 2, 3, 4, 5, 6, 7), "10:00-02:00", (), 0),
    ("助教陪练1小时+台费", "ASSISTANT", "158.00", "228.00", 60, (1, 2, 3, 4, 5, 6, 7), "12:00-24:00", (), 60),
    ("周末欢乐4小时（送红牛🐂）", "TABLE_GOODS", "128.00", "232.00", 240, (6, 7), "10:00-22:00", (("红牛🐂 250ml", 2),), 0),
    ("【学生专享】美式九球2小时", "TABLE_TIME", "25", "70.00", 120, (1, 2, 3, 4, 5), "12:00-18:00", (), 0),
    ("包夜畅打（22:00-08:00）", "TABLE_TIME", "99.00", "260.00", 600, (5, 6), "22:00-08:00", (), 0),
    ("教学套餐：中式八球入门课", "ASSISTANT", "199", "300.00", 90, (1, 2, 3, 4, 5, 6, 7), "10:00-20:00", (), 90),
)

COUPON_TEMPLATES = (  # name, type, face value, rate, min spend
    ("满200减20", "CASH", "20", "", "200"), ("满100减10", "CASH", "10", "", "100"), ("无门槛5元券", "CASH", "5", "", "0"),
    ("台费88折券", "DISCOUNT", "", "0.88", "0"), ("新人9折券（限首单）", "DISCOUNT", "", "0.90", "50"),
    ("1小时时长券", "TABLE_HOURS", "48", "", "0"), ("2小时时长券🎱", "TABLE_HOURS", "96", "", "0"),
    ("满300减50", "CASH", "50", "", "300"),
)


def _created_and_updated(store: Store) -> tuple[datetime, datetime]:
    created = store.history_time()
    return created, (created if store.rng.random() < 0.4 else store.later(created))


def make_area(store: Store, at: datetime | None = None) -> Record:
    """ODS_TABLE_AREA record (upstream-api.md §4.9); ``tableCount`` is filled in by :func:`count_tables`."""
    area_id = store.next_number("areaId", start=1)
    name = AREA_NAMES[(area_id - 1) % len(AREA_NAMES)]
    if area_id > len(AREA_NAMES):
        name = f"{name}{area_id}"
    updated = at or _created_and_updated(store)[1]
    return record("areaId", area_id, store.site_id, areaName=name, remark=store.rng.choice(REMARKS[:8]),
                  sortNo=area_id * 10, tableCount=0, enabled=1, updateTime=store.stamp(updated))


def _table_type_for(area_name: str, rng) -> str:
    if "斯诺克" in area_name:
        return "SNOOKER"
    if "美式" in area_name:
        return "POOL9"
    return rng.choices(("CN8", "SNOOKER", "POOL9"), (8, 1, 1))[0]


def make_table(store: Store, area: Record, at: datetime | None = None) -> Record:
    """ODS_BILLIARD_TABLE record (upstream-api.md §4.8)."""
    rng = store.rng
    table_id = store.next_number("tableId", start=1, step_max=2)
    table_type = _table_type_for(area["areaName"], rng)
    index = store.next_number(f"tableNo:{area['areaId']}:{table_type}", start=1)
    letter = chr(ord("A") + (area["areaId"] - 1) % 26)
    name = f"斯诺克{index}号" if table_type == "SNOOKER" else f"{letter}{index:02d}"
    updated = at or _created_and_updated(store)[1]
    return record(
        "tableId", table_id, store.site_id, tableName=name, areaId=area["areaId"], tableType=table_type,
        priceRuleName=PRICE_RULES[table_type], unitPrice=money(rng, rng.choice(TABLE_PRICES[table_type])),
        sortNo=table_id, enabled=1 if rng.random() < 0.95 else 0,
        currentStatus=rng.choices(("IDLE", "RESERVED", "MAINTENANCE"), (90, 6, 4))[0],
        updateTime=store.stamp(updated),
    )


def count_tables(store: Store) -> None:
    """Set every area's ``tableCount`` from the current tables (copy-on-write)."""
    counts: dict[int, int] = {}
    for table in store.values("ODS_BILLIARD_TABLE"):
        counts[table["areaId"]] = counts.get(table["areaId"], 0) + 1
    for area in store.values("ODS_TABLE_AREA"):
        if area["tableCount"] != counts.get(area["areaId"], 0):
            store.put("ODS_TABLE_AREA", {**area, "tableCount": counts.get(area["areaId"], 0)})


def category_plan(count: int) -> list[tuple[str, str | None]]:
    """(name, parent name) pairs in creation order: each root directly followed by its children."""
    plan: list[tuple[str, str | None]] = []
    for root, children in CATEGORY_TREE:
        plan.append((root, None))
        plan.extend((child, root) for child in children)
    while len(plan) < count:
        plan.append((f"自定义分类{len(plan) + 1}", None))
    return plan[:count]


def make_category(store: Store, name: str, parent: Record | None, at: datetime | None = None) -> Record:
    """ODS_GOODS_CATEGORY record (upstream-api.md §4.11)."""
    category_id = store.next_number("categoryId", start=10, step_max=3)
    updated = at or _created_and_updated(store)[1]
    return record(
        "categoryId", category_id, store.site_id, categoryName=name,
        parentId=parent["categoryId"] if parent else 0, level=2 if parent else 1, sortNo=category_id,
        enabled=1 if store.rng.random() < 0.95 else 0, updateTime=store.stamp(updated),
    )


def _goods_id(store: Store) -> str:
    number = store.next_number("goodsId", start=100001, step_max=37)
    if store.rng.random() < 0.1:
        return f"0{number % 100000:05d}"  # numeric-looking with a leading zero (Q4)
    return str(number)


def make_goods(store: Store, template_index: int | None = None, at: datetime | None = None) -> Record:
    """ODS_GOODS record (upstream-api.md §4.10); ``stockQty`` is set by the inventory timeline."""
    rng = store.rng
    index = rng.randrange(len(GOODS_CATALOG)) if template_index is None else template_index
    name, unit, price, category_name = GOODS_CATALOG[index % len(GOODS_CATALOG)]
    if index >= len(GOODS_CATALOG):
        name = f"{name}（{GOODS_VARIANTS[(index // len(GOODS_CATALOG) - 1) % len(GOODS_VARIANTS)]}" \
               f"{index // (len(GOODS_CATALOG) * len(GOODS_VARIANTS)) or ''}）"
    goods_id = _goods_id(store)
    while goods_id in store.records["ODS_GOODS"]:
        goods_id = _goods_id(store)
    categories = store.values("ODS_GOODS_CATEGORY")
    category = next((c for c in categories if c["categoryName"] == category_name), None)
    if category is None and categories:
        category = rng.choice(categories)
    sale = cents(price)
    specs = []
    if rng.random() < 0.1:
        specs = [{"specName": "冰镇", "price": money(rng, sale + 1)}, {"specName": "常温", "price": money(rng, sale)}]
    created, updated = (at, at) if at else _created_and_updated(store)
    return record(
        "goodsId", goods_id, store.site_id, goodsName=name, categoryId=category["categoryId"] if category else 0,
        barcode=ean13(rng) if rng.random() < 0.8 else "", unit=unit, salePrice=money(rng, sale),
        memberPrice=money(rng, sale * Decimal("0.9")) if rng.random() < 0.35 else "",
        costPrice=float(round(float(sale) * rng.uniform(0.3, 0.6), 1)), stockQty=rng.randint(40, 200),
        isOnSale=1 if rng.random() < 0.93 else 0, specs=specs, createTime=store.stamp(created),
        updateTime=store.stamp(updated),
    )


def make_assistant(store: Store, at: datetime | None = None) -> Record:
    """ODS_ASSISTANT record (upstream-api.md §4.14)."""
    rng = store.rng
    number = store.next_number("assistantNo", start=rng.randint(1, 20), step_max=3)
    level, price = rng.choice(ASSISTANT_LEVELS)
    name = ASSISTANT_NAMES[number % len(ASSISTANT_NAMES)]
    if number >= len(ASSISTANT_NAMES):
        name = f"{name}{number // len(ASSISTANT_NAMES) + 1}"
    status = "ACTIVE" if rng.random() < 0.85 else "LEFT"
    created, updated = (at, at) if at else _created_and_updated(store)
    assistant_id = f"AS{number:04d}"
    return record(
        "assistantId", assistant_id, store.site_id, assistantNo=f"{number:03d}", name=name,
        gender=2 if rng.random() < 0.8 else 1, mobile=masked_phone(rng), levelName=level,
        hourlyPrice=money(rng, price), skills=rng.sample(SKILLS, rng.randint(1, 3)), status=status,
        onShift=1 if status == "ACTIVE" and rng.random() < 0.5 else 0, entryDate=fmt_date(created),
        avatarUrl=f"https://img.feiqiu.example/avatar/{assistant_id}.jpg" if rng.random() < 0.7 else "",
        updateTime=store.stamp(updated),
    )


def make_package(store: Store, at: datetime | None = None) -> Record:
    """ODS_GROUP_PACKAGE record (upstream-api.md §4.16); its §5.3 extras go to ``store.package_extras``."""
    rng = store.rng
    number = store.next_number("package", start=1)
    template = PACKAGE_TEMPLATES[(number - 1) % len(PACKAGE_TEMPLATES)]
    name, kind, sale, original, minutes, weekdays, time_range, goods_contents, assistant_minutes = template
    if number > len(PACKAGE_TEMPLATES):
        name = f"{name}（第{number // len(PACKAGE_TEMPLATES) + 1}期）"
    created, updated = (at, at) if at else _created_and_updated(store)
    platform = "DOUYIN" if number % 2 == 0 else "MEITUAN"
    package_id = f"PKG{created:%Y%m}{store.next_number('packageNo', start=rng.randint(1, 30), step_max=9):06d}"
    end = "" if rng.random() < 0.5 else fmt_date(created + timedelta(days=rng.randint(200, 500)))
    package = record(
        "packageId", package_id, store.site_id, platform=platform,
        platformDealId=digits(rng, 19) if platform == "DOUYIN" else digits(rng, 9), packageName=name,
        packageType=kind, salePrice=money(rng, sale), originalPrice=money(rng, original), durationMinutes=minutes,
        saleStartDate=fmt_date(created), saleEndDate=end, usableWeekdays=list(weekdays), usableTimeRange=time_range,
        status="ON_SALE" if rng.random() < 0.85 else "OFF_SALE", createTime=store.stamp(created),
        updateTime=store.stamp(updated),
    )
    store.package_extras[package_id] = {
        "usageRules": {
            "applicableTableTypes": ["SNOOKER"] if "斯诺克" in name else rng.sample(["CN8", "POOL9"], rng.randint(1, 2)),
            "maxPerVisit": rng.randint(1, 4), "stackable": 0 if rng.random() < 0.8 else 1,
            "needReservation": 1 if rng.random() < 0.3 else 0,
            "notes": rng.choice(("不与其他优惠同享；节假日通用", "需提前1小时预约（电话/小程序）", "每桌限用1张，超时按门市价计费", "")),
        },
        "contents": package_contents(store, package_id, minutes, goods_contents, assistant_minutes, original),
    }
    return package


def package_contents(store: Store, package_id: str, minutes: int, goods_contents, assistant_minutes: int,
                     original: str) -> list[Record]:
    """§5.3 content rows; values add up to the package's list price."""
    rng = store.rng
    rows: list[Record] = []
    remaining = cents(original)
    for goods_name, qty in goods_contents:
        goods = next((g for g in store.values("ODS_GOODS") if g["goodsName"] == goods_name), None)
        value = cents(GOODS_CATALOG[[g[0] for g in GOODS_CATALOG].index(goods_name)][2]) * qty
        remaining -= value
        rows.append(_content(store, package_id, _Line("GOODS", goods["goodsId"] if goods else "", goods_name, qty,
                                                      "瓶", value)))
    if assistant_minutes:
        value = min(remaining, cents(120 * assistant_minutes / 60))
        remaining -= value
        rows.append(_content(store, package_id, _Line("ASSISTANT_TIME", "", "助教陪练", assistant_minutes, "分钟",
                                                      value)))
    if minutes:
        table_name = rng.choice(("中式台球桌", "斯诺克球台", "美式九球桌"))
        rows.insert(0, _content(store, package_id, _Line("TABLE_TIME", "", table_name, minutes, "分钟", remaining)))
    for index, row in enumerate(rows, start=1):
        row["contentId"] = index
    return rows


@dataclass(frozen=True)
class _Line:
    """One §5.3 content row before it has a number: its type, the goods it refers to ("": none), name, quantity,
    unit and value (a negative value counts as 0)."""

    kind: str
    ref: str
    name: str
    qty: int
    unit: str
    value: Decimal


def _content(store: Store, package_id: str, line: _Line) -> Record:
    """A §5.3 content row of ``package_id``; its ``contentId`` is given by :func:`package_contents` (0 until then)."""
    return {"packageId": package_id, "contentId": 0, "contentType": line.kind, "refId": line.ref, "name": line.name,
            "qty": line.qty, "unit": line.unit, "valueAmount": money(store.rng, max(line.value, Decimal(0)))}


def make_coupon(store: Store, at: datetime | None = None) -> Record:
    """ODS_COUPON record (upstream-api.md §4.20)."""
    rng = store.rng
    coupon_id = store.next_number("couponId", start=501, step_max=4)
    name, kind, face, rate, min_spend = COUPON_TEMPLATES[(coupon_id - 501) % len(COUPON_TEMPLATES)]
    created, updated = (at, at) if at else _created_and_updated(store)
    return record(
        "couponId", coupon_id, store.site_id, couponName=name, couponType=kind,
        faceValue=money(rng, face) if face else "", discountRate=rate, minSpend=f"{cents(min_spend):.2f}",
        validDays=rng.choice((7, 30, 60, 90)), issuedCount=rng.randint(20, 3000),
        status="ACTIVE" if rng.random() < 0.85 else "STOPPED", createTime=store.stamp(created),
        updateTime=store.stamp(updated),
    )


def make_member(store: Store, at: datetime | None = None) -> Record:
    """ODS_MEMBER record (upstream-api.md §4.2); its §5.4 tag objects go to ``store.member_tags``."""
    rng = store.rng
    created, updated = (at, at) if at else _created_and_updated(store)
    member_id = store.ids.id64(created)
    level_id, level_name, rate = rng.choices(MEMBER_LEVELS, (50, 25, 18, 7))[0]
    tags = rng.sample(MEMBER_TAGS, rng.choices((0, 1, 2), (50, 35, 15))[0])
    store.member_tags[member_id] = [{"tagId": t[0], "tagName": t[1], "color": t[2]} for t in tags]
    referrer = (store.random_key("ODS_MEMBER") or 0) if rng.random() < 0.15 else 0
    birthday = ""
    if rng.random() < 0.6:
        birthday = fmt_date(datetime(1970, 1, 1) + timedelta(days=rng.randint(0, 365 * 36)))
    return record(
        "memberId", member_id, store.site_id, memberNo=f"{store.next_number('memberNo', 1, step_max=3):08d}",
        name=store.faker.name() if rng.random() < 0.6 else "", nickname=rng.choice(NICKNAMES),
        mobile=masked_phone(rng), gender=rng.choices((0, 1, 2), (10, 60, 30))[0],
        status=1 if rng.random() < 0.95 else 2, birthday=birthday,
        level={"levelId": level_id, "levelName": level_name, "discountRate": rate},
        points=rng.randint(0, 5000), tags=[t[1] for t in tags], registerSource=rng.choice(REGISTER_SOURCES),
        referrerId=referrer, createTime=store.stamp(created), updateTime=store.stamp(updated),
    )


def make_card(store: Store, member: Record, at: datetime | None = None) -> Record:
    """ODS_MEMBER_CARD record (upstream-api.md §4.3) owned by ``member``."""
    rng = store.rng
    card_type_id, type_name, kind = rng.choices(CARD_TYPES, (35, 20, 20, 15, 10))[0]
    number = store.next_number("cardNo", start=8801000 + rng.randint(0, 999), step_max=5)
    card_id = f"{number:010d}"
    owned = store.cards_of(member["memberId"])
    opened = at or store.later(datetime.strptime(member["createTime"], "%Y-%m-%d %H:%M:%S"))
    balance = cents(rng.choice((0, 50, 100, 200, 300, 500, 800, 1200))) if kind == "STORED_VALUE" else cents(0)
    gift = cents(rng.choice((0, 0, 20, 50, 100))) if kind == "STORED_VALUE" else cents(0)
    store.card_last_use[card_id] = ""
    return record(
        "cardId", card_id, store.site_id, memberId=member["memberId"], cardTypeId=card_type_id,
        cardTypeName=type_name, cardKind=kind, balance=money(rng, balance), giftBalance=money(rng, gift),
        discountRate="0.88" if kind == "DISCOUNT" else ("0.95" if kind == "STORED_VALUE" and rng.random() < 0.3 else ""),
        remainingTimes=rng.randint(0, 10) if kind == "TIMES" else "",
        status=rng.choices((1, 2, 3, 4), (90, 4, 4, 2))[0], isDefault=0 if owned else 1,
        expireDate="" if rng.random() < 0.6 else fmt_date(opened + timedelta(days=rng.choice((365, 730)))),
        openTime=store.stamp(opened), updateTime=store.stamp(opened),
    )


def generate_master(store: Store, profile) -> None:
    """Create all snapshot records of a store (upstream-api.md §4.1 rows 1, 2, 7–10, 13, 15, 19)."""
    rng = store.rng
    for _ in range(profile.areas):
        store.put("ODS_TABLE_AREA", make_area(store))
    areas = store.values("ODS_TABLE_AREA")
    for index in range(profile.tables):
        store.put("ODS_BILLIARD_TABLE", make_table(store, areas[index % len(areas)]))
    count_tables(store)
    by_name: dict[str, Record] = {}
    for name, parent in category_plan(profile.categories):
        by_name[name] = store.put("ODS_GOODS_CATEGORY", make_category(store, name, by_name.get(parent)))
    for index in range(profile.goods):
        store.put("ODS_GOODS", make_goods(store, template_index=index))
    for _ in range(profile.assistants):
        store.put("ODS_ASSISTANT", make_assistant(store))
    for _ in range(profile.packages):
        store.put("ODS_GROUP_PACKAGE", make_package(store))
    for _ in range(profile.coupons):
        store.put("ODS_COUPON", make_coupon(store))
    members = [store.put("ODS_MEMBER", make_member(store)) for _ in range(profile.members)]
    for index in range(profile.cards):
        owner = members[index] if index < len(members) * 0.8 else rng.choice(members)
        store.put("ODS_MEMBER_CARD", make_card(store, owner))
